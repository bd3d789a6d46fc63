"""The embedded Runge–Kutta pairs the adaptive integrator runs, as data.

An :class:`EmbeddedPair` holds everything that tells one method from another: the stage coefficients, the error
weights, the controller's order and the dense-output rows. ``dynamics/integrate.py`` has one adaptive loop, fed by
these tables as scipy's ``RungeKutta`` class is by its subclasses' ``A``, ``B``, ``C``, ``E`` and ``P``
(``dynamics/rk_kernels.py`` writes the arithmetic on them out as code).

References
----------
J. R. Dormand, P. J. Prince, "A family of embedded Runge-Kutta formulae", J. Comput. Appl. Math. 6 (1980) 19–26.
P. J. Prince, J. R. Dormand, "High order embedded Runge-Kutta formulae", J. Comput. Appl. Math. 7 (1981) 67–75.
E. Hairer, S. P. Nørsett, G. Wanner, *Solving Ordinary Differential Equations I: Nonstiff Problems*, 2nd ed.,
Springer (1993): §II.5 (DOPRI5), §II.6 (dense output), §II.10 (DOP853); and the authors' published codes DOPRI5 and
DOP853 (Fortran ``dopri5.f`` and ``dop853.f`` by E. Hairer and G. Wanner, and their C translations ``dopri5.c`` and
``dop853.c``), whose constants are the coefficients used here.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EmbeddedPair", "DOPRI5", "DOP853", "METHODS"]


@dataclass(frozen=True)
class EmbeddedPair:
    """An explicit embedded Runge–Kutta pair with continuous output, first same as last.

    Stages are numbered from 0; ``k_s = f(t + c_s h, y + h Σ_{r<s} a_{sr} k_r)``. The step has ``n_stages`` stages, the
    last of which is ``f(t + h, y_new)`` (its row of ``a`` holds the weights ``b`` of the propagated solution, and it
    is the next step's stage 0); the stages after it (``len(c) − n_stages`` of them) are computed only for the dense
    output, in steps that hold an output time.

    Attributes
    ----------
    name : str
    order : int
        Order of the propagated solution.
    error_order : int
        Order q of the error estimator: the controller scales the step by ``err^(−1/(q + 1))`` and the starting-step
        rule uses the same exponent.
    n_stages : int
        Stages of one step, the first-same-as-last one included.
    c : tuple of float
        Nodes of every stage, the dense output's extra stages last.
    a : tuple of tuples of float
        Row ``s`` holds ``a_{s0} … a_{s,s−1}``; row ``n_stages − 1`` is ``b``.
    error : tuple of float
        Weights ``e_s`` of the error estimate ``h Σ e_s k_s`` over the ``n_stages`` stages.
    error_3 : tuple of float or None
        DOP853 only: the weights of the embedded 3rd-order estimate. When present the error norm is DOP853's
        ``|h| ‖e₅‖² / √(n (‖e₅‖² + 0.01 ‖e₃‖²))`` (Hairer–Nørsett–Wanner §II.10) instead of ``‖h Σ e_s k_s‖``.
    dense : tuple of tuples of float
        Rows ``d`` of the interpolant's terms ``h Σ_s d_s k_s`` over all stages; they follow three Hermite terms built
        from ``Δ = y_new − y``, ``k₀`` and the last stage, and the interpolant is
        ``y + θ(F₀ + (1 − θ)(F₁ + θ(F₂ + (1 − θ)(F₃ + …))))``.
    hermite_as_scipy : bool
        How the third Hermite term is rounded: ``F₂ = Δ − h k_last − F₁`` as in Hairer's codes (False), or
        ``2Δ − h(k_last + k₀)`` as scipy's ``DOP853`` writes it (True). The two are equal in exact arithmetic.
    """

    name: str
    order: int
    error_order: int
    n_stages: int
    c: tuple
    a: tuple
    error: tuple
    error_3: tuple | None
    dense: tuple
    hermite_as_scipy: bool

    @property
    def b(self) -> tuple:
        """Weights of the propagated solution over stages 0 … n_stages − 2."""
        return self.a[self.n_stages - 1]


# ---- Dormand–Prince 5(4) (dopri5.f; Hairer–Nørsett–Wanner Table II.5.2 and §II.6) ------------------------------

DOPRI5 = EmbeddedPair(
    name="DOPRI5",
    order=5,
    error_order=4,
    n_stages=7,
    c=(0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0),
    a=(
        (),
        (1 / 5,),
        (3 / 40, 9 / 40),
        (44 / 45, -56 / 15, 32 / 9),
        (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
        (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
        (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
    ),
    # 5th-order minus embedded 4th-order weights
    error=(71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40),
    error_3=None,
    # Hairer's dense output of order 4 (dopri5.f, d1 … d7)
    dense=((-12715105075 / 11282082432, 0.0, 87487479700 / 32700410799, -10690763975 / 1880347072,
            701980252875 / 199316789632, -1453857185 / 822651844, 69997945 / 29380423),),
    hermite_as_scipy=False,
)


# ---- Dormand–Prince 8(5,3) --------------------------------------------------------------------------------------
#
# The decimal coefficients printed in Hairer and Wanner's ``dop853.f`` (its ``c``, ``a``, ``b``, ``bhh``, ``er`` and
# ``d`` constants), as scipy.integrate also carries them; tests/test_tableaus.py checks that every value here is the
# float scipy uses, bit for bit.

_DOP853_C = (
    0.0,
    0.526001519587677318785587544488e-01,
    0.789002279381515978178381316732e-01,
    0.118350341907227396726757197510,
    0.281649658092772603273242802490,
    0.333333333333333333333333333333,
    0.25,
    0.307692307692307692307692307692,
    0.651282051282051282051282051282,
    0.6,
    0.857142857142857142857142857142,
    1.0,
    1.0,
    0.1,  # the dense output's three extra stages
    0.2,
    0.777777777777777777777777777778,
)

# Row s lists (column, a_{s,column}) for the nonzero entries.
_DOP853_A = (
    (),
    ((0, 5.26001519587677318785587544488e-2),),
    ((0, 1.97250569845378994544595329183e-2), (1, 5.91751709536136983633785987549e-2)),
    ((0, 2.95875854768068491816892993775e-2), (2, 8.87627564304205475450678981324e-2)),
    ((0, 2.41365134159266685502369798665e-1), (2, -8.84549479328286085344864962717e-1),
     (3, 9.24834003261792003115737966543e-1)),
    ((0, 3.7037037037037037037037037037e-2), (3, 1.70828608729473871279604482173e-1),
     (4, 1.25467687566822425016691814123e-1)),
    ((0, 3.7109375e-2), (3, 1.70252211019544039314978060272e-1), (4, 6.02165389804559606850219397283e-2),
     (5, -1.7578125e-2)),
    ((0, 3.70920001185047927108779319836e-2), (3, 1.70383925712239993810214054705e-1),
     (4, 1.07262030446373284651809199168e-1), (5, -1.53194377486244017527936158236e-2),
     (6, 8.27378916381402288758473766002e-3)),
    ((0, 6.24110958716075717114429577812e-1), (3, -3.36089262944694129406857109825),
     (4, -8.68219346841726006818189891453e-1), (5, 2.75920996994467083049415600797e1),
     (6, 2.01540675504778934086186788979e1), (7, -4.34898841810699588477366255144e1)),
    ((0, 4.77662536438264365890433908527e-1), (3, -2.48811461997166764192642586468),
     (4, -5.90290826836842996371446475743e-1), (5, 2.12300514481811942347288949897e1),
     (6, 1.52792336328824235832596922938e1), (7, -3.32882109689848629194453265587e1),
     (8, -2.03312017085086261358222928593e-2)),
    ((0, -9.3714243008598732571704021658e-1), (3, 5.18637242884406370830023853209),
     (4, 1.09143734899672957818500254654), (5, -8.14978701074692612513997267357),
     (6, -1.85200656599969598641566180701e1), (7, 2.27394870993505042818970056734e1),
     (8, 2.49360555267965238987089396762), (9, -3.0467644718982195003823669022)),
    ((0, 2.27331014751653820792359768449), (3, -1.05344954667372501984066689879e1),
     (4, -2.00087205822486249909675718444), (5, -1.79589318631187989172765950534e1),
     (6, 2.79488845294199600508499808837e1), (7, -2.85899827713502369474065508674),
     (8, -8.87285693353062954433549289258), (9, 1.23605671757943030647266201528e1),
     (10, 6.43392746015763530355970484046e-1)),
    # row 12: the 8th-order weights b (dop853.f's b1 … b12)
    ((0, 5.42937341165687622380535766363e-2), (5, 4.45031289275240888144113950566),
     (6, 1.89151789931450038304281599044), (7, -5.8012039600105847814672114227),
     (8, 3.1116436695781989440891606237e-1), (9, -1.52160949662516078556178806805e-1),
     (10, 2.01365400804030348374776537501e-1), (11, 4.47106157277725905176885569043e-2)),
    # rows 13–15: the dense output's extra stages
    ((0, 5.61675022830479523392909219681e-2), (6, 2.53500210216624811088794765333e-1),
     (7, -2.46239037470802489917441475441e-1), (8, -1.24191423263816360469010140626e-1),
     (9, 1.5329179827876569731206322685e-1), (10, 8.20105229563468988491666602057e-3),
     (11, 7.56789766054569976138603589584e-3), (12, -8.298e-3)),
    ((0, 3.18346481635021405060768473261e-2), (5, 2.83009096723667755288322961402e-2),
     (6, 5.35419883074385676223797384372e-2), (7, -5.49237485713909884646569340306e-2),
     (10, -1.08347328697249322858509316994e-4), (11, 3.82571090835658412954920192323e-4),
     (12, -3.40465008687404560802977114492e-4), (13, 1.41312443674632500278074618366e-1)),
    ((0, -4.28896301583791923408573538692e-1), (5, -4.69762141536116384314449447206),
     (6, 7.68342119606259904184240953878), (7, 4.06898981839711007970213554331),
     (8, 3.56727187455281109270669543021e-1), (12, -1.39902416515901462129418009734e-3),
     (13, 2.9475147891527723389556272149), (14, -9.15095847217987001081870187138)),
)

# The embedded 3rd-order solution's weights (dop853.f's bhh1, bhh2, bhh3, on stages 0, 8 and 11): the 3rd-order
# estimate's weights are b minus these, computed in float64 as scipy computes them.
_DOP853_BHH = ((0, 0.244094488188976377952755905512), (8, 0.733846688281611857341361741547),
               (11, 0.220588235294117647058823529412e-1))

# The 5th-order estimate's weights (dop853.f's er1, er6 … er12).
_DOP853_E5 = ((0, 0.1312004499419488073250102996e-1), (5, -0.1225156446376204440720569753e+1),
              (6, -0.4957589496572501915214079952), (7, 0.1664377182454986536961530415e+1),
              (8, -0.3503288487499736816886487290), (9, 0.3341791187130174790297318841),
              (10, 0.8192320648511571246570742613e-1), (11, -0.2235530786388629525884427845e-1))

# The dense output's rows d4 … d7 (dop853.f's d41 … d716) over the 16 stages.
_DOP853_D = (
    ((0, -0.84289382761090128651353491142e+1), (5, 0.56671495351937776962531783590),
     (6, -0.30689499459498916912797304727e+1), (7, 0.23846676565120698287728149680e+1),
     (8, 0.21170345824450282767155149946e+1), (9, -0.87139158377797299206789907490),
     (10, 0.22404374302607882758541771650e+1), (11, 0.63157877876946881815570249290),
     (12, -0.88990336451333310820698117400e-1), (13, 0.18148505520854727256656404962e+2),
     (14, -0.91946323924783554000451984436e+1), (15, -0.44360363875948939664310572000e+1)),
    ((0, 0.10427508642579134603413151009e+2), (5, 0.24228349177525818288430175319e+3),
     (6, 0.16520045171727028198505394887e+3), (7, -0.37454675472269020279518312152e+3),
     (8, -0.22113666853125306036270938578e+2), (9, 0.77334326684722638389603898808e+1),
     (10, -0.30674084731089398182061213626e+2), (11, -0.93321305264302278729567221706e+1),
     (12, 0.15697238121770843886131091075e+2), (13, -0.31139403219565177677282850411e+2),
     (14, -0.93529243588444783865713862664e+1), (15, 0.35816841486394083752465898540e+2)),
    ((0, 0.19985053242002433820987653617e+2), (5, -0.38703730874935176555105901742e+3),
     (6, -0.18917813819516756882830838328e+3), (7, 0.52780815920542364900561016686e+3),
     (8, -0.11573902539959630126141871134e+2), (9, 0.68812326946963000169666922661e+1),
     (10, -0.10006050966910838403183860980e+1), (11, 0.77771377980534432092869265740),
     (12, -0.27782057523535084065932004339e+1), (13, -0.60196695231264120758267380846e+2),
     (14, 0.84320405506677161018159903784e+2), (15, 0.11992291136182789328035130030e+2)),
    ((0, -0.25693933462703749003312586129e+2), (5, -0.15418974869023643374053993627e+3),
     (6, -0.23152937917604549567536039109e+3), (7, 0.35763911791061412378285349910e+3),
     (8, 0.93405324183624310003907691704e+2), (9, -0.37458323136451633156875139351e+2),
     (10, 0.10409964950896230045147246184e+3), (11, 0.29840293426660503123344363579e+2),
     (12, -0.43533456590011143754432175058e+2), (13, 0.96324553959188282948394950600e+2),
     (14, -0.39177261675615439165231486172e+2), (15, -0.14972683625798562581422125276e+3)),
)


def _dense_row(entries, length: int) -> tuple:
    """A row of ``length`` floats from its (column, value) entries, zeros elsewhere."""
    row = [0.0] * length
    for column, value in entries:
        row[column] = value
    return tuple(row)


def _dop853() -> EmbeddedPair:
    a = tuple(_dense_row(entries, s) for s, entries in enumerate(_DOP853_A))
    b = a[12] + (0.0,)  # over the 13 stages of a step
    bhh = _dense_row(_DOP853_BHH, 13)
    return EmbeddedPair(
        name="DOP853",
        order=8,
        error_order=7,
        n_stages=13,
        c=_DOP853_C,
        a=a,
        error=_dense_row(_DOP853_E5, 13),
        error_3=tuple(weight - third for weight, third in zip(b, bhh)),
        dense=tuple(_dense_row(entries, 16) for entries in _DOP853_D),
        hermite_as_scipy=True,
    )


DOP853 = _dop853()

# The methods the adaptive loop runs; a method's position here is its index in the compiled code
# (dynamics/rk_kernels_generated.py).
METHODS = (DOPRI5, DOP853)
