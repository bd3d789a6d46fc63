import time, numpy as np, sys
sys.path.insert(0,'/tmp')
from numba import njit
from smokerhs import osc
import dynamics.integrate as I
te=np.linspace(0,10,57)
t=time.time(); osc(0.0, np.ones(2), np.ones(1)); print("osc", time.time()-t)
t=time.time(); I._state_status(np.ones(2), 1.0); print("status", time.time()-t)
t=time.time(); I.solve_rk4(osc, [1.0,0.0], (0,1), 0.1, [2.0]); print("rk4", time.time()-t)
t=time.time(); I.iterate_map(njit(lambda k,x,p: 0.5*x), [1.0], 3); print("map", time.time()-t)
t=time.time(); I.solve_dopri5(osc, [1.0,0.0], te, [2.0]); print("dopri", time.time()-t)
