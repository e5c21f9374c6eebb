//! The parsed form of a math answer, exact rationals, complex numbers, and evaluation.
//!
//! Equality of expressions is decided by evaluation rather than by a computer-algebra system:
//! symbol-free expressions are computed exactly as rationals where they can be (integers,
//! fractions, decimals, integer powers, factorials, binomials), otherwise as complex `f64`;
//! expressions with variables are evaluated at a few seeded random points (two polynomials that
//! agree on random points are equal with overwhelming probability).

use std::collections::BTreeSet;

/// An exact rational `num / den`, reduced, `den > 0`. Operations return `None` on overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ratio {
    pub num: i128,
    pub den: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    a = a.abs();
    b = b.abs();
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Ratio {
    pub fn new(num: i128, den: i128) -> Option<Ratio> {
        if den == 0 {
            return None;
        }
        let g = gcd(num, den).max(1);
        let (n, d) = (num / g, den / g);
        Some(if d < 0 { Ratio { num: n.checked_neg()?, den: d.checked_neg()? } } else { Ratio { num: n, den: d } })
    }

    pub fn int(n: i128) -> Ratio {
        Ratio { num: n, den: 1 }
    }

    pub fn is_int(self) -> bool {
        self.den == 1
    }

    pub fn add(self, o: Ratio) -> Option<Ratio> {
        let num = self.num.checked_mul(o.den)?.checked_add(o.num.checked_mul(self.den)?)?;
        Ratio::new(num, self.den.checked_mul(o.den)?)
    }

    pub fn mul(self, o: Ratio) -> Option<Ratio> {
        let g1 = gcd(self.num, o.den).max(1);
        let g2 = gcd(o.num, self.den).max(1);
        Ratio::new((self.num / g1).checked_mul(o.num / g2)?, (self.den / g2).checked_mul(o.den / g1)?)
    }

    pub fn neg(self) -> Option<Ratio> {
        Some(Ratio { num: self.num.checked_neg()?, den: self.den })
    }

    pub fn recip(self) -> Option<Ratio> {
        Ratio::new(self.den, self.num)
    }

    pub fn pow(self, e: i128) -> Option<Ratio> {
        if e < 0 {
            return self.recip()?.pow(e.checked_neg()?);
        }
        let e = u32::try_from(e).ok()?;
        Ratio::new(self.num.checked_pow(e)?, self.den.checked_pow(e)?)
    }

    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }
}

/// A complex number (the values expressions evaluate to).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct C64 {
    pub re: f64,
    pub im: f64,
}

impl C64 {
    pub const fn real(re: f64) -> C64 {
        C64 { re, im: 0.0 }
    }
    pub const I: C64 = C64 { re: 0.0, im: 1.0 };

    pub fn add(self, o: C64) -> C64 {
        C64 { re: self.re + o.re, im: self.im + o.im }
    }
    pub fn sub(self, o: C64) -> C64 {
        C64 { re: self.re - o.re, im: self.im - o.im }
    }
    pub fn mul(self, o: C64) -> C64 {
        C64 { re: self.re * o.re - self.im * o.im, im: self.re * o.im + self.im * o.re }
    }
    pub fn div(self, o: C64) -> C64 {
        let d = o.re * o.re + o.im * o.im;
        C64 { re: (self.re * o.re + self.im * o.im) / d, im: (self.im * o.re - self.re * o.im) / d }
    }
    pub fn neg(self) -> C64 {
        C64 { re: -self.re, im: -self.im }
    }
    pub fn abs(self) -> f64 {
        self.re.hypot(self.im)
    }
    pub fn is_finite(self) -> bool {
        self.re.is_finite() && self.im.is_finite()
    }
    pub fn is_real(self) -> bool {
        self.im.abs() <= 1e-12 * self.re.abs().max(1.0)
    }
    pub fn exp(self) -> C64 {
        let m = self.re.exp();
        C64 { re: m * self.im.cos(), im: m * self.im.sin() }
    }
    /// Principal logarithm.
    pub fn ln(self) -> C64 {
        C64 { re: self.abs().ln(), im: self.im.atan2(self.re) }
    }
    /// Principal power; exact for real bases with integer exponents.
    pub fn pow(self, e: C64) -> C64 {
        if e.im == 0.0 && e.re.fract() == 0.0 && e.re.abs() <= 64.0 {
            let n = e.re as i32;
            if self.im == 0.0 {
                return C64::real(self.re.powi(n));
            }
            let mut out = C64::real(1.0);
            for _ in 0..n.unsigned_abs() {
                out = out.mul(self);
            }
            return if n < 0 { C64::real(1.0).div(out) } else { out };
        }
        if self.re == 0.0 && self.im == 0.0 {
            return if e.re > 0.0 { C64::real(0.0) } else { C64::real(f64::NAN) };
        }
        if self.im == 0.0 && self.re > 0.0 && e.im == 0.0 {
            return C64::real(self.re.powf(e.re));
        }
        e.mul(self.ln()).exp()
    }
    pub fn sin(self) -> C64 {
        C64 { re: self.re.sin() * self.im.cosh(), im: self.re.cos() * self.im.sinh() }
    }
    pub fn cos(self) -> C64 {
        C64 { re: self.re.cos() * self.im.cosh(), im: -self.re.sin() * self.im.sinh() }
    }
}

/// Named constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Const {
    Pi,
    E,
    I,
    Infinity,
}

/// Functions of one or two arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Sin,
    Cos,
    Tan,
    Cot,
    Sec,
    Csc,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Tanh,
    Ln,
    /// `log(x, base)`; base 10 when written `\log x` (two arguments always).
    Log,
    Exp,
    Abs,
    Floor,
    Ceil,
    Factorial,
    Binom,
}

/// A relation of a chain `a < b = c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl RelOp {
    /// The same relation with its sides swapped (`<` ↔ `>`).
    pub fn flipped(self) -> RelOp {
        match self {
            RelOp::Lt => RelOp::Gt,
            RelOp::Gt => RelOp::Lt,
            RelOp::Le => RelOp::Ge,
            RelOp::Ge => RelOp::Le,
            other => other,
        }
    }
}

/// A parsed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A number as written: exact when it fits (`value`), `float` when written with a decimal
    /// point (decimals compare to 6 places, as the reference checker does).
    Num { value: Option<Ratio>, approx: f64, float: bool },
    Const(Const),
    /// A variable: one letter (lowercased: answers do not distinguish `R` from `r`), a Greek letter
    /// name, with its subscript (`x_1`).
    Sym(String),
    /// A word from `\text{…}` (lowercased, spaces removed).
    Word(String),
    /// A sum; subtraction is `Neg`.
    Add(Vec<Expr>),
    /// A product, factors in written order (implicit products of letters spell words).
    Mul(Vec<Expr>),
    /// `a / b`.
    Div(Box<Expr>, Box<Expr>),
    Neg(Box<Expr>),
    Pow(Box<Expr>, Box<Expr>),
    Func(Func, Vec<Expr>),
    /// `x\%`.
    Percent(Box<Expr>),
    /// `a \pm b`: the two values `a + b` and `a - b`.
    PlusMinus(Box<Expr>, Box<Expr>),
    /// An ordered tuple `(a, b, c)` (or a point whose coordinates cannot form an interval).
    Tuple(Vec<Expr>),
    /// An unordered set `\{a, b\}` or a bare list `a, b`.
    Set(Vec<Expr>),
    Interval { lo: Box<Expr>, hi: Box<Expr>, lo_open: bool, hi_open: bool },
    Union(Vec<Expr>),
    Matrix(Vec<Vec<Expr>>),
    /// A chain of relations: `items[0] ops[0] items[1] ops[1] items[2]…`.
    Rel(Vec<Expr>, Vec<RelOp>),
}

impl Expr {
    pub fn int(n: i128) -> Expr {
        Expr::Num { value: Some(Ratio::int(n)), approx: n as f64, float: false }
    }

    /// A number written with a decimal point (possibly negated or a percentage of one).
    pub fn is_float_atom(&self) -> bool {
        match self {
            Expr::Num { float, .. } => *float,
            Expr::Neg(e) | Expr::Percent(e) => e.is_float_atom(),
            _ => false,
        }
    }

    /// A plain number (possibly negated or a percentage).
    pub fn is_number_atom(&self) -> bool {
        match self {
            Expr::Num { .. } => true,
            Expr::Neg(e) | Expr::Percent(e) => e.is_number_atom(),
            _ => false,
        }
    }

    /// Whether this is a set-like value (set, tuple, interval, union).
    pub fn is_set_like(&self) -> bool {
        matches!(self, Expr::Set(_) | Expr::Tuple(_) | Expr::Interval { .. } | Expr::Union(_))
    }

    pub fn is_relation(&self) -> bool {
        matches!(self, Expr::Rel(..))
    }

    /// Every variable (and word) the expression mentions.
    pub fn free_symbols(&self, out: &mut BTreeSet<String>) {
        match self {
            Expr::Sym(s) | Expr::Word(s) => {
                out.insert(s.clone());
            }
            Expr::Num { .. } | Expr::Const(_) => {}
            Expr::Add(v) | Expr::Mul(v) | Expr::Func(_, v) | Expr::Tuple(v) | Expr::Set(v) | Expr::Union(v) | Expr::Rel(v, _) => {
                v.iter().for_each(|e| e.free_symbols(out))
            }
            Expr::Div(a, b) | Expr::Pow(a, b) | Expr::PlusMinus(a, b) => {
                a.free_symbols(out);
                b.free_symbols(out);
            }
            Expr::Interval { lo, hi, .. } => {
                lo.free_symbols(out);
                hi.free_symbols(out);
            }
            Expr::Neg(e) | Expr::Percent(e) => e.free_symbols(out),
            Expr::Matrix(rows) => rows.iter().flatten().for_each(|e| e.free_symbols(out)),
        }
    }

    pub fn has_symbols(&self) -> bool {
        let mut s = BTreeSet::new();
        self.free_symbols(&mut s);
        !s.is_empty()
    }

    /// The exact value of a symbol-free rational expression, if it has one.
    pub fn exact(&self) -> Option<Ratio> {
        match self {
            Expr::Num { value, .. } => *value,
            Expr::Neg(e) => e.exact()?.neg(),
            Expr::Percent(e) => e.exact()?.mul(Ratio::new(1, 100)?),
            Expr::Add(v) => v.iter().try_fold(Ratio::int(0), |acc, e| acc.add(e.exact()?)),
            Expr::Mul(v) => v.iter().try_fold(Ratio::int(1), |acc, e| acc.mul(e.exact()?)),
            Expr::Div(a, b) => a.exact()?.mul(b.exact()?.recip()?),
            Expr::Pow(b, e) => {
                let e = e.exact()?;
                if !e.is_int() || e.num.abs() > 4096 {
                    return None;
                }
                b.exact()?.pow(e.num)
            }
            Expr::Func(Func::Factorial, v) => {
                let n = v[0].exact()?;
                if !n.is_int() || !(0..=33).contains(&n.num) {
                    return None;
                }
                (1..=n.num).try_fold(Ratio::int(1), |acc, k| acc.mul(Ratio::int(k)))
            }
            Expr::Func(Func::Binom, v) => {
                let (n, k) = (v[0].exact()?, v[1].exact()?);
                if !n.is_int() || !k.is_int() || n.num < 0 || k.num < 0 || n.num > 120 {
                    return None;
                }
                if k.num > n.num {
                    return Some(Ratio::int(0));
                }
                (0..k.num).try_fold(Ratio::int(1), |acc, j| acc.mul(Ratio::new(n.num - j, j + 1)?))
            }
            Expr::Func(Func::Abs, v) => {
                let x = v[0].exact()?;
                Some(Ratio { num: x.num.checked_abs()?, den: x.den })
            }
            _ => None,
        }
    }

    /// The value at an assignment of the free symbols (`None` for structures and unknown symbols).
    pub fn eval(&self, env: &dyn Fn(&str) -> Option<C64>) -> Option<C64> {
        Some(match self {
            Expr::Num { value, approx, .. } => C64::real(value.map_or(*approx, Ratio::to_f64)),
            Expr::Const(Const::Pi) => C64::real(std::f64::consts::PI),
            Expr::Const(Const::E) => C64::real(std::f64::consts::E),
            Expr::Const(Const::I) => C64::I,
            Expr::Const(Const::Infinity) => C64::real(f64::INFINITY),
            Expr::Sym(s) | Expr::Word(s) => env(s)?,
            Expr::Add(v) => v.iter().try_fold(C64::real(0.0), |acc, e| Some(acc.add(e.eval(env)?)))?,
            Expr::Mul(v) => v.iter().try_fold(C64::real(1.0), |acc, e| Some(acc.mul(e.eval(env)?)))?,
            Expr::Div(a, b) => a.eval(env)?.div(b.eval(env)?),
            Expr::Neg(e) => e.eval(env)?.neg(),
            Expr::Percent(e) => e.eval(env)?.div(C64::real(100.0)),
            Expr::Pow(b, e) => b.eval(env)?.pow(e.eval(env)?),
            Expr::Func(f, args) => {
                let x = args.first()?.eval(env)?;
                let one = C64::real(1.0);
                match f {
                    Func::Sin => x.sin(),
                    Func::Cos => x.cos(),
                    Func::Tan => x.sin().div(x.cos()),
                    Func::Cot => x.cos().div(x.sin()),
                    Func::Sec => one.div(x.cos()),
                    Func::Csc => one.div(x.sin()),
                    Func::Asin if x.is_real() && x.re.abs() <= 1.0 => C64::real(x.re.asin()),
                    Func::Acos if x.is_real() && x.re.abs() <= 1.0 => C64::real(x.re.acos()),
                    Func::Atan if x.is_real() => C64::real(x.re.atan()),
                    Func::Asin | Func::Acos | Func::Atan => return None,
                    Func::Sinh => x.exp().sub(x.neg().exp()).div(C64::real(2.0)),
                    Func::Cosh => x.exp().add(x.neg().exp()).div(C64::real(2.0)),
                    Func::Tanh => {
                        let (a, b) = (x.exp(), x.neg().exp());
                        a.sub(b).div(a.add(b))
                    }
                    Func::Ln => x.ln(),
                    Func::Log => x.ln().div(args.get(1)?.eval(env)?.ln()),
                    Func::Exp => x.exp(),
                    Func::Abs => C64::real(x.abs()),
                    Func::Floor if x.is_real() => C64::real(x.re.floor()),
                    Func::Ceil if x.is_real() => C64::real(x.re.ceil()),
                    Func::Floor | Func::Ceil => return None,
                    Func::Factorial => {
                        if !x.is_real() || x.re < 0.0 || x.re.fract() != 0.0 || x.re > 170.0 {
                            return None;
                        }
                        C64::real((1..=x.re as u32).map(f64::from).product())
                    }
                    Func::Binom => {
                        let k = args.get(1)?.eval(env)?;
                        if !x.is_real() || !k.is_real() || k.re.fract() != 0.0 || k.re < 0.0 || k.re > 170.0 {
                            return None;
                        }
                        C64::real((0..k.re as u32).map(|j| (x.re - f64::from(j)) / f64::from(j + 1)).product())
                    }
                }
            }
            _ => return None,
        })
    }
}
