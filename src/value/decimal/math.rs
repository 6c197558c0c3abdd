//! Decimal128 square root, exponential, logarithms and power, as mongod computes `$sqrt`,
//! `$exp`, `$ln`, `$log10`, `$log` and `$pow` when an operand is a decimal (the Intel decimal
//! library's `bid128_sqrt`, `_exp`, `_log`, `_log10`, `_log2`, `_exp10`, `_exp2` and `_pow`).
//!
//! The square root is exact, then rounded once. The others are computed in fixed point with
//! 72 fractional digits (about 38 digits beyond the result's 34), then rounded once, half to
//! even: the correctly rounded result except when the exact value lies within about 10^-38 of
//! a rounding boundary. Exact results keep their exact form: `ln(1)` is `0`, a logarithm that
//! is an integer is that integer, `exp(0)` is `1`, an exact square root takes the exponent
//! closest to half the operand's (IEEE 754's preferred exponent).

use std::cmp::Ordering;

use super::{finish, Dec, Rounding, MIN_EXP};

/// One limb of a wide natural: 18 decimal digits.
const LIMB: u64 = 1_000_000_000_000_000_000;
const LIMB_DIGITS: usize = 18;
/// Fractional limbs of a fixed-point value (72 digits).
const FRAC: usize = 4;
const FRAC_DIGITS: i32 = (FRAC * LIMB_DIGITS) as i32;

const LN10: &str = "2.302585092994045684017991454684364207601101488628772976033327900967572609677352480235997205089598298";
const LN2: &str = "0.6931471805599453094172321214581765680755001343602552541206800094933936219696947156058633269964186875";
const INV_LN10: &str = "0.4342944819032518276511289189166050822943970058036665661144537831658646492088707747292249493384317484";

/// A natural number in base 10^18, least significant limb first, without leading zero limbs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Nat(Vec<u64>);

impl Nat {
    fn zero() -> Nat {
        Nat(Vec::new())
    }

    fn from_u128(mut v: u128) -> Nat {
        let mut limbs = Vec::new();
        while v > 0 {
            limbs.push((v % u128::from(LIMB)) as u64);
            v /= u128::from(LIMB);
        }
        Nat(limbs)
    }

    /// From decimal digits, most significant first.
    fn from_digits(digits: &[u8]) -> Nat {
        let mut limbs = Vec::with_capacity(digits.len() / LIMB_DIGITS + 1);
        for chunk in digits.rchunks(LIMB_DIGITS) {
            limbs.push(chunk.iter().fold(0u64, |a, d| a * 10 + u64::from(*d)));
        }
        Nat(limbs).trimmed()
    }

    fn trimmed(mut self) -> Nat {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
        self
    }

    fn is_zero(&self) -> bool {
        self.0.is_empty()
    }

    /// Decimal digits, most significant first (`[0]` for zero).
    fn digits(&self) -> Vec<u8> {
        let Some((top, rest)) = self.0.split_last() else {
            return vec![0];
        };
        let mut text = top.to_string();
        for limb in rest.iter().rev() {
            text.push_str(&format!("{limb:018}"));
        }
        text.bytes().map(|b| b - b'0').collect()
    }

    fn compare(&self, other: &Nat) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }

    fn add(&self, other: &Nat) -> Nat {
        let mut out = Vec::with_capacity(self.0.len().max(other.0.len()) + 1);
        let mut carry = 0u64;
        for i in 0..self.0.len().max(other.0.len()) {
            let s =
                self.0.get(i).copied().unwrap_or(0) + other.0.get(i).copied().unwrap_or(0) + carry;
            out.push(s % LIMB);
            carry = s / LIMB;
        }
        if carry > 0 {
            out.push(carry);
        }
        Nat(out)
    }

    /// `self - other`, for `self >= other`.
    fn sub(&self, other: &Nat) -> Nat {
        let mut out = Vec::with_capacity(self.0.len());
        let mut borrow = 0u64;
        for (i, a) in self.0.iter().enumerate() {
            let b = other.0.get(i).copied().unwrap_or(0) + borrow;
            if *a >= b {
                out.push(a - b);
                borrow = 0;
            } else {
                out.push(a + LIMB - b);
                borrow = 1;
            }
        }
        Nat(out).trimmed()
    }

    fn mul(&self, other: &Nat) -> Nat {
        if self.is_zero() || other.is_zero() {
            return Nat::zero();
        }
        let mut acc = vec![0u128; self.0.len() + other.0.len() + 1];
        for (i, a) in self.0.iter().enumerate() {
            for (j, b) in other.0.iter().enumerate() {
                let cell = &mut acc[i + j];
                *cell += u128::from(*a) * u128::from(*b);
                // Keep each cell below 2^127 by carrying as soon as it passes one limb squared.
                if *cell >= u128::from(LIMB) * u128::from(LIMB) {
                    let carry = *cell / u128::from(LIMB);
                    *cell %= u128::from(LIMB);
                    acc[i + j + 1] += carry;
                }
            }
        }
        let mut out = Vec::with_capacity(acc.len());
        let mut carry = 0u128;
        for cell in acc {
            let v = cell + carry;
            out.push((v % u128::from(LIMB)) as u64);
            carry = v / u128::from(LIMB);
        }
        Nat(out).trimmed()
    }

    fn mul_small(&self, m: u64) -> Nat {
        self.mul(&Nat::from_u128(u128::from(m)))
    }

    /// `self / d`, truncated.
    fn div_small(&self, d: u64) -> Nat {
        let mut out = vec![0u64; self.0.len()];
        let mut rem = 0u128;
        for i in (0..self.0.len()).rev() {
            let cur = rem * u128::from(LIMB) + u128::from(self.0[i]);
            out[i] = (cur / u128::from(d)) as u64;
            rem = cur % u128::from(d);
        }
        Nat(out).trimmed()
    }

    /// `self × 10^k`.
    fn times_pow10(&self, k: usize) -> Nat {
        if self.is_zero() {
            return Nat::zero();
        }
        let mut limbs = vec![0u64; k / LIMB_DIGITS];
        limbs.extend_from_slice(&self.0);
        Nat(limbs).mul_small(10u64.pow((k % LIMB_DIGITS) as u32))
    }

    /// `self / 10^k`, truncated.
    fn div_pow10(&self, k: usize) -> Nat {
        let whole = k / LIMB_DIGITS;
        if whole >= self.0.len() {
            return Nat::zero();
        }
        Nat(self.0[whole..].to_vec()).div_small(10u64.pow((k % LIMB_DIGITS) as u32))
    }
}

/// A signed fixed-point value: `±mag / 10^72`.
#[derive(Debug, Clone)]
struct Fx {
    neg: bool,
    mag: Nat,
}

impl Fx {
    fn int(i: i64) -> Fx {
        Fx {
            neg: i < 0,
            mag: Nat::from_u128(u128::from(i.unsigned_abs())).times_pow10(FRAC_DIGITS as usize),
        }
    }

    /// `±coef × 10^exp`, truncated to 72 fractional digits. Callers keep the value below
    /// about 10^6 in magnitude.
    fn from_parts(neg: bool, coef: u128, exp: i32) -> Fx {
        let shift = exp + FRAC_DIGITS;
        let c = Nat::from_u128(coef);
        let mag = if shift >= 0 {
            c.times_pow10(shift as usize)
        } else {
            c.div_pow10(shift.unsigned_abs() as usize)
        };
        Fx { neg, mag }
    }

    /// A constant written with a decimal point, truncated to 72 fractional digits.
    fn constant(text: &str) -> Fx {
        let (int, frac) = text.split_once('.').unwrap_or((text, ""));
        let mut digits: Vec<u8> = int.bytes().map(|b| b - b'0').collect();
        digits.extend(
            frac.bytes()
                .map(|b| b - b'0')
                .chain(std::iter::repeat(0))
                .take(FRAC_DIGITS as usize),
        );
        Fx {
            neg: false,
            mag: Nat::from_digits(&digits),
        }
    }

    /// The double's value, to the 17 significant digits that identify it.
    fn from_f64(f: f64) -> Fx {
        let text = format!("{:.16e}", f.abs());
        let (mantissa, e) = text.split_once('e').unwrap_or((text.as_str(), "0"));
        let e: i32 = e.parse().unwrap_or(0);
        let digits: Vec<u8> = mantissa
            .bytes()
            .filter(u8::is_ascii_digit)
            .map(|b| b - b'0')
            .collect();
        let coef = digits.iter().fold(0u128, |c, d| c * 10 + u128::from(*d));
        Fx::from_parts(f < 0.0, coef, e - 16)
    }

    fn is_zero(&self) -> bool {
        self.mag.is_zero()
    }

    fn negate(mut self) -> Fx {
        self.neg = !self.neg;
        self
    }

    fn add(&self, other: &Fx) -> Fx {
        if self.neg == other.neg {
            return Fx {
                neg: self.neg,
                mag: self.mag.add(&other.mag),
            };
        }
        match self.mag.compare(&other.mag) {
            Ordering::Less => Fx {
                neg: other.neg,
                mag: other.mag.sub(&self.mag),
            },
            _ => Fx {
                neg: self.neg,
                mag: self.mag.sub(&other.mag),
            },
        }
    }

    fn sub(&self, other: &Fx) -> Fx {
        self.add(&other.clone().negate())
    }

    fn mul(&self, other: &Fx) -> Fx {
        let mag = self.mag.mul(&other.mag);
        Fx {
            neg: self.neg != other.neg,
            mag: Nat(mag.0.get(FRAC..).map(<[u64]>::to_vec).unwrap_or_default()),
        }
    }

    fn mul_int(&self, i: i64) -> Fx {
        Fx {
            neg: self.neg != (i < 0),
            mag: self.mag.mul_small(i.unsigned_abs()),
        }
    }

    fn div_small(&self, d: u64) -> Fx {
        Fx {
            neg: self.neg,
            mag: self.mag.div_small(d),
        }
    }

    fn to_f64(&self) -> f64 {
        let digits = self.mag.digits();
        let text: String = digits.iter().map(|d| char::from(b'0' + d)).collect();
        let v: f64 = format!("{text}e-{FRAC_DIGITS}").parse().unwrap_or(0.0);
        if self.neg {
            -v
        } else {
            v
        }
    }

    /// The value × 10^`scale`, rounded once to a decimal128; `inexact` when the fixed-point
    /// value is an approximation.
    fn to_dec(&self, scale: i32, inexact: bool) -> Dec {
        finish(
            self.neg,
            self.mag.digits(),
            scale - FRAC_DIGITS,
            inexact,
            Rounding::HalfEven,
            MIN_EXP,
        )
    }

    /// The nearest integer, when the value lies within 10^-60 of it.
    fn near_integer(&self) -> Option<i64> {
        let unit = Nat::from_u128(1).times_pow10(FRAC_DIGITS as usize);
        let half = unit.div_small(2);
        let whole = self.mag.add(&half).div_pow10(FRAC_DIGITS as usize);
        let nearest = whole.times_pow10(FRAC_DIGITS as usize);
        let gap = match self.mag.compare(&nearest) {
            Ordering::Less => nearest.sub(&self.mag),
            _ => self.mag.sub(&nearest),
        };
        let tolerance = Nat::from_u128(1).times_pow10((FRAC_DIGITS - 60) as usize);
        if gap.compare(&tolerance) == Ordering::Greater || whole.0.len() > 1 {
            return None;
        }
        let w = i64::try_from(whole.0.first().copied().unwrap_or(0)).ok()?;
        Some(if self.neg { -w } else { w })
    }
}

/// `e^x` for `|x|` up to about 3: the Taylor series of `x / 2^10`, squared ten times.
fn exp_small(x: &Fx) -> Fx {
    let r = x.div_small(1024);
    let one = Fx::int(1);
    let mut sum = one.clone();
    let mut term = one;
    let mut n = 1u64;
    loop {
        term = term.mul(&r).div_small(n);
        if term.is_zero() {
            break;
        }
        sum = sum.add(&term);
        n += 1;
    }
    for _ in 0..10 {
        sum = sum.mul(&sum);
    }
    sum
}

/// `ln m` for `m` in [1, 10): Newton's iteration `y + m·e^-y - 1` from the double's
/// logarithm, each step doubling the correct digits.
fn ln_mantissa(m: &Fx) -> Fx {
    let mut y = Fx::from_f64(m.to_f64().ln());
    let one = Fx::int(1);
    for _ in 0..3 {
        let e = exp_small(&y.clone().negate());
        y = y.add(&m.mul(&e)).sub(&one);
    }
    y
}

/// `e^t` for any fixed-point `t`, rounded to a decimal128 (overflow to +Infinity, underflow
/// to zero).
fn exp_fx(t: &Fx) -> Dec {
    if t.is_zero() {
        return Dec::Finite {
            neg: false,
            coef: 1,
            exp: 0,
        };
    }
    let approx = t.to_f64();
    if approx > 14_300.0 {
        return Dec::Inf { neg: false };
    }
    if approx < -14_300.0 {
        return Dec::Finite {
            neg: false,
            coef: 0,
            exp: MIN_EXP,
        };
    }
    let ln10 = Fx::constant(LN10);
    let k = (approx / std::f64::consts::LN_10).round() as i64;
    let r = t.sub(&ln10.mul_int(k));
    exp_small(&r).to_dec(k as i32, true)
}

/// The decimal's value as `m × 10^j` with `m` in [1, 10), `m` in fixed point (exact: at most
/// 34 digits).
fn mantissa_and_power(coef: u128, exp: i32) -> (Fx, i64) {
    let n = super::digit_count(coef) as i32;
    (
        Fx::from_parts(false, coef, 1 - n),
        i64::from(exp) + i64::from(n) - 1,
    )
}

/// Whether `coef` is a power of ten.
fn is_power_of_ten(mut coef: u128) -> bool {
    while coef >= 10 && coef % 10 == 0 {
        coef /= 10;
    }
    coef == 1
}

/// `ln x` in fixed point for a positive finite `x`.
fn ln_fx(coef: u128, exp: i32) -> Fx {
    let (m, j) = mantissa_and_power(coef, exp);
    ln_mantissa(&m).add(&Fx::constant(LN10).mul_int(j))
}

/// An integer as a decimal with exponent 0.
fn integer(i: i64) -> Dec {
    Dec::from_i64(i)
}

/// A fixed-point logarithm as its result: the integer when it is one, otherwise rounded.
fn logarithm_result(y: &Fx) -> Dec {
    match y.near_integer() {
        Some(i) => integer(i),
        None => y.to_dec(0, true),
    }
}

/// Whether a decimal is an integer, and if so whether it is odd.
fn integer_parity(d: Dec) -> Option<bool> {
    let Dec::Finite { coef, exp, .. } = d else {
        return None;
    };
    if exp >= 0 || coef == 0 {
        // A multiple of 10 (or zero) is even.
        return Some(exp == 0 && coef % 2 == 1);
    }
    let drop = exp.unsigned_abs();
    if drop > 38 {
        return None;
    }
    let unit = 10u128.pow(drop);
    (coef % unit == 0).then_some((coef / unit) % 2 == 1)
}

impl Dec {
    /// The sign bit (`-0` has it; NaN does not), as mongod's `Decimal128::isNegative`.
    pub fn is_sign_negative(self) -> bool {
        self.sign()
    }

    fn one() -> Dec {
        Dec::Finite {
            neg: false,
            coef: 1,
            exp: 0,
        }
    }

    /// The square root (`$sqrt`), exact before its one rounding; NaN below zero.
    pub fn sqrt(self) -> Dec {
        match self {
            Dec::NaN | Dec::Inf { neg: true } => Dec::NaN,
            Dec::Inf { neg: false } => self,
            Dec::Finite { neg, coef: 0, exp } => Dec::Finite {
                neg,
                coef: 0,
                exp: exp.div_euclid(2),
            },
            Dec::Finite { neg: true, .. } => Dec::NaN,
            Dec::Finite {
                neg: false,
                coef,
                exp,
            } => {
                // Scale the coefficient to at least 70 digits, keeping the exponent even.
                let n = super::digit_count(coef) as i32;
                let mut shift = (70 - n).max(0);
                if (exp - shift).rem_euclid(2) != 0 {
                    shift += 1;
                }
                let target = Nat::from_u128(coef).times_pow10(shift as usize);
                let root = isqrt(&target);
                let exact = root.mul(&root) == target;
                let root_exp = (exp - shift) / 2;
                if !exact {
                    return finish(
                        false,
                        root.digits(),
                        root_exp,
                        true,
                        Rounding::HalfEven,
                        MIN_EXP,
                    );
                }
                // Exact: drop trailing zeros toward the preferred exponent floor(exp / 2).
                let mut digits = root.digits();
                let mut e = root_exp;
                let preferred = exp.div_euclid(2);
                while e < preferred && digits.len() > 1 && digits.last() == Some(&0) {
                    digits.pop();
                    e += 1;
                }
                finish(false, digits, e, false, Rounding::HalfEven, MIN_EXP)
            }
        }
    }

    /// `e^x` (`$exp`).
    pub fn exp(self) -> Dec {
        match self {
            Dec::NaN => Dec::NaN,
            Dec::Inf { neg: false } => self,
            Dec::Inf { neg: true } => Dec::ZERO,
            Dec::Finite { coef: 0, .. } => Dec::one(),
            Dec::Finite { neg, coef, exp } => {
                let magnitude = i64::from(exp) + i64::from(super::digit_count(coef));
                if magnitude > 6 {
                    return exp_fx(&Fx::int(if neg { -1_000_000 } else { 1_000_000 }));
                }
                let x = Fx::from_parts(neg, coef, exp);
                if x.is_zero() {
                    // Below 10^-72: e^x rounds to one, inexactly.
                    return Fx::int(1).to_dec(0, true);
                }
                exp_fx(&x)
            }
        }
    }

    /// The natural logarithm (`$ln`): NaN below zero, -Infinity at zero.
    pub fn ln(self) -> Dec {
        match self {
            Dec::NaN | Dec::Inf { neg: true } => Dec::NaN,
            Dec::Inf { neg: false } => self,
            Dec::Finite { coef: 0, .. } => Dec::Inf { neg: true },
            Dec::Finite { neg: true, .. } => Dec::NaN,
            Dec::Finite { coef, exp, .. } => {
                let (_, j) = mantissa_and_power(coef, exp);
                if j == 0 && is_power_of_ten(coef) {
                    return Dec::ZERO;
                }
                ln_fx(coef, exp).to_dec(0, true)
            }
        }
    }

    /// The base-10 logarithm (`$log10`); an exact power of ten gives its integer exponent.
    pub fn log10(self) -> Dec {
        match self {
            Dec::NaN | Dec::Inf { neg: true } => Dec::NaN,
            Dec::Inf { neg: false } => self,
            Dec::Finite { coef: 0, .. } => Dec::Inf { neg: true },
            Dec::Finite { neg: true, .. } => Dec::NaN,
            Dec::Finite { coef, exp, .. } => {
                let (m, j) = mantissa_and_power(coef, exp);
                if is_power_of_ten(coef) {
                    return integer(j);
                }
                let y = ln_mantissa(&m)
                    .mul(&Fx::constant(INV_LN10))
                    .add(&Fx::int(j));
                y.to_dec(0, true)
            }
        }
    }

    /// The base-2 logarithm.
    fn log2(self) -> Dec {
        match self {
            Dec::NaN | Dec::Inf { neg: true } => Dec::NaN,
            Dec::Inf { neg: false } => self,
            Dec::Finite { coef: 0, .. } => Dec::Inf { neg: true },
            Dec::Finite { neg: true, .. } => Dec::NaN,
            Dec::Finite { coef, exp, .. } => {
                let y = ln_fx(coef, exp);
                // ln x / ln 2, by one long division of the fixed-point values.
                logarithm_result(&divide(&y, &Fx::constant(LN2)))
            }
        }
    }

    /// `$log`'s decimal logarithm as mongod computes it (`Decimal128::logarithm(base)`): base 2
    /// and base 10 by their own functions, any other base as the natural logarithm divided by
    /// the base itself (not by its logarithm), which is what mongod returns.
    pub fn log_base(self, base: Dec) -> Dec {
        if base.total_cmp(Dec::from_i64(2)) == Ordering::Equal {
            return self.log2();
        }
        if base.total_cmp(Dec::from_i64(10)) == Ordering::Equal {
            return self.log10();
        }
        match self.ln().divided_by(base) {
            Ok(d) => d,
            Err(_) => Dec::NaN,
        }
    }

    /// `self^y` (`$pow`) as mongod computes it: base 10 and base 2 by their exponential
    /// functions, others by `pow`; the result is then added to zero with the smallest exponent,
    /// which widens it to 34 digits.
    pub fn power(self, y: Dec) -> Dec {
        let raw = if self.total_cmp(Dec::from_i64(10)) == Ordering::Equal {
            exp_base(&Fx::constant(LN10), y)
        } else if self.total_cmp(Dec::from_i64(2)) == Ordering::Equal {
            exp_base(&Fx::constant(LN2), y)
        } else {
            general_power(self, y)
        };
        raw.plus(Dec::Finite {
            neg: false,
            coef: 0,
            exp: MIN_EXP,
        })
    }
}

/// `a / b` in fixed point (`b` nonzero), by long division of the scaled magnitudes.
fn divide(a: &Fx, b: &Fx) -> Fx {
    let numerator = a.mag.times_pow10(FRAC_DIGITS as usize);
    // Long division in decimal digits: numbers here are about 150 digits.
    let digits = numerator.digits();
    let mut quotient = Vec::with_capacity(digits.len());
    let mut rem = Nat::zero();
    for d in digits {
        rem = rem.mul_small(10).add(&Nat::from_u128(u128::from(d)));
        let mut q = 0u8;
        while rem.compare(&b.mag) != Ordering::Less {
            rem = rem.sub(&b.mag);
            q += 1;
        }
        quotient.push(q);
    }
    Fx {
        neg: a.neg != b.neg,
        mag: Nat::from_digits(&quotient),
    }
}

/// `base^y` where `ln_base` is `ln base` (10 or 2): exact for an integer `y`, else `e^(y·ln)`.
fn exp_base(ln_base: &Fx, y: Dec) -> Dec {
    match y {
        Dec::NaN => Dec::NaN,
        Dec::Inf { neg: false } => Dec::Inf { neg: false },
        Dec::Inf { neg: true } => Dec::ZERO,
        Dec::Finite { coef: 0, .. } => Dec::one(),
        Dec::Finite { neg, coef, exp } => {
            let magnitude = i64::from(exp) + i64::from(super::digit_count(coef));
            if magnitude > 6 {
                return exp_fx(&Fx::int(if neg { -1_000_000 } else { 1_000_000 }));
            }
            let t = Fx::from_parts(neg, coef, exp).mul(ln_base);
            if t.is_zero() {
                return Fx::int(1).to_dec(0, true);
            }
            exp_fx(&t)
        }
    }
}

/// IEEE 754's `pow(x, y)` for decimals.
fn general_power(x: Dec, y: Dec) -> Dec {
    let one = Dec::one();
    if y.is_zero() || x.total_cmp(one) == Ordering::Equal {
        return one;
    }
    if x.is_nan() || y.is_nan() {
        return Dec::NaN;
    }
    let y_neg = y.sign();
    let odd = integer_parity(y);
    let x_neg = x.sign();
    if x_neg && odd.is_none() && !matches!(y, Dec::Inf { .. }) && !x.is_zero() {
        // A negative base with a fractional exponent.
        if !matches!(x, Dec::Inf { .. }) {
            return Dec::NaN;
        }
    }
    let result_neg = x_neg && odd == Some(true);
    let signed = |d: Dec| if result_neg { d.negate() } else { d };
    match (x, y) {
        (Dec::Inf { .. }, _) => signed(if y_neg {
            Dec::ZERO
        } else {
            Dec::Inf { neg: false }
        }),
        (_, Dec::Inf { .. }) => {
            let size = x.abs().total_cmp(one);
            match (size, y_neg) {
                (Ordering::Equal, _) => one,
                (Ordering::Greater, false) | (Ordering::Less, true) => Dec::Inf { neg: false },
                _ => Dec::ZERO,
            }
        }
        (Dec::Finite { coef: 0, .. }, _) => signed(if y_neg {
            Dec::Inf { neg: false }
        } else {
            Dec::ZERO
        }),
        (
            Dec::Finite { coef, exp, .. },
            Dec::Finite {
                neg,
                coef: yc,
                exp: ye,
            },
        ) => {
            let magnitude = i64::from(ye) + i64::from(super::digit_count(yc));
            let ln_x = ln_fx(coef, exp);
            if ln_x.is_zero() {
                return signed(one);
            }
            let t = if magnitude > 40 {
                // |y| ≥ 10^40 and |ln|x|| > 10^-35 (x has at most 34 digits): far beyond the
                // exponent range either way.
                Fx::int(if neg != ln_x.neg {
                    -1_000_000
                } else {
                    1_000_000
                })
            } else {
                Fx::from_parts(neg, yc, ye).mul(&ln_x)
            };
            signed(exp_fx(&t))
        }
        _ => Dec::NaN,
    }
}

/// The integer square root, digit by digit from the most significant.
fn isqrt(n: &Nat) -> Nat {
    let digits = n.digits().len();
    let mut root = Nat::zero();
    for position in (0..digits.div_ceil(2)).rev() {
        for d in (1..=9u64).rev() {
            let candidate = root.add(&Nat::from_u128(u128::from(d)).times_pow10(position));
            if candidate.mul(&candidate).compare(n) != Ordering::Greater {
                root = candidate;
                break;
            }
        }
    }
    root
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::Decimal128;

    fn d(s: &str) -> Dec {
        Dec::from_decimal128(&s.parse::<Decimal128>().expect("test literal"))
    }

    /// Expected values: Python's `decimal` module in the decimal128 context (prec=34,
    /// ROUND_HALF_EVEN, Emin=-6143, Emax=6144, clamp=1), whose `sqrt`, `exp`, `ln` and `log10`
    /// are correctly rounded; `log` to a base other than 2 and 10 is `ln(x)` rounded, then
    /// divided by the base, as mongod computes it; `pow` is then added to `0E-6176`, as mongod
    /// does; integer logarithms computed at 90 digits are written as integers.
    #[test]
    fn functions_match_correctly_rounded_decimal128() {
        let cases = [
            ("sqrt", "2", "", "1.414213562373095048801688724209698"),
            ("sqrt", "4", "", "2"),
            ("sqrt", "1.00", "", "1.0"),
            ("sqrt", "0.0001", "", "0.01"),
            ("sqrt", "1E-6176", "", "1E-3088"),
            (
                "sqrt",
                "9999999999999999999999999999999999",
                "",
                "99999999999999999.99999999999999999",
            ),
            (
                "sqrt",
                "1E+6111",
                "",
                "3.162277660168379331998893544432719E+3055",
            ),
            ("sqrt", "0", "", "0"),
            ("sqrt", "-0", "", "-0"),
            ("sqrt", "0E+5", "", "0E+2"),
            ("sqrt", "0.25", "", "0.5"),
            (
                "sqrt",
                "123456789.123456789",
                "",
                "11111.11106611111096943055498174930",
            ),
            ("sqrt", "1E-1", "", "0.3162277660168379331998893544432719"),
            ("sqrt", "10", "", "3.162277660168379331998893544432719"),
            ("sqrt", "2E+1", "", "4.472135954999579392818347337462552"),
            ("sqrt", "0E-3", "", "0.00"),
            ("sqrt", "NaN", "", "NaN"),
            ("sqrt", "Infinity", "", "Infinity"),
            ("sqrt", "0.5", "", "0.7071067811865475244008443621048490"),
            (
                "sqrt",
                "3E-6176",
                "",
                "1.732050807568877293527446341505872E-3088",
            ),
            ("exp", "0", "", "1"),
            ("exp", "1", "", "2.718281828459045235360287471352662"),
            ("exp", "-1", "", "0.3678794411714423215955237701614609"),
            ("exp", "0.5", "", "1.648721270700128146848650787814164"),
            ("exp", "10", "", "22026.46579480671651695790064528424"),
            ("exp", "100", "", "2.688117141816135448412625551580014E+43"),
            ("exp", "-100", "", "3.720075976020835962959695803863118E-44"),
            ("exp", "1E-40", "", "1.000000000000000000000000000000000"),
            ("exp", "-1E-40", "", "1.000000000000000000000000000000000"),
            (
                "exp",
                "14000",
                "",
                "1.326620321137711275937776890335631E+6080",
            ),
            (
                "exp",
                "-14000",
                "",
                "7.537951771629720907593006284141136E-6081",
            ),
            ("exp", "15000", "", "Infinity"),
            ("exp", "-15000", "", "0E-6176"),
            (
                "exp",
                "2.302585092994045684017991454684364",
                "",
                "9.999999999999999999999999999999998",
            ),
            (
                "exp",
                "1234.5678",
                "",
                "1.465490729309594799834821385039798E+536",
            ),
            (
                "exp",
                "-0.000001",
                "",
                "0.9999990000004999998333333749999917",
            ),
            ("exp", "Infinity", "", "Infinity"),
            ("exp", "-Infinity", "", "0"),
            ("exp", "NaN", "", "NaN"),
            ("exp", "1E-6176", "", "1.000000000000000000000000000000000"),
            ("exp", "-14220", "", "2E-6176"),
            (
                "exp",
                "14144.2",
                "",
                "5.597716969353815713952728234422767E+6142",
            ),
            (
                "exp",
                "-14142.1",
                "",
                "1.458839372779208083470985088834639E-6142",
            ),
            ("exp", "1E+10", "", "Infinity"),
            ("exp", "-1E+10", "", "0E-6176"),
            ("ln", "1", "", "0"),
            ("ln", "2", "", "0.6931471805599453094172321214581766"),
            ("ln", "10", "", "2.302585092994045684017991454684364"),
            ("ln", "0.5", "", "-0.6931471805599453094172321214581766"),
            ("ln", "1E-6176", "", "-14220.76553433122614449511522413063"),
            (
                "ln",
                "9.999999999999999999999999999999999E+6144",
                "",
                "14149.38539644841072829055748903542",
            ),
            (
                "ln",
                "1.000000000000000000000000000000001",
                "",
                "9.999999999999999999999999999999995E-34",
            ),
            (
                "ln",
                "0.9999999999999999999999999999999999",
                "",
                "-1.000000000000000000000000000000000E-34",
            ),
            ("ln", "100", "", "4.605170185988091368035982909368728"),
            ("ln", "1E+100", "", "230.2585092994045684017991454684364"),
            ("ln", "3.14159", "", "1.144729041185178381216412580436159"),
            ("ln", "Infinity", "", "Infinity"),
            ("ln", "1.00", "", "0"),
            ("ln", "0", "", "-Infinity"),
            ("ln", "NaN", "", "NaN"),
            ("ln", "7E-3000", "", "-6905.809368833081738748869011309649"),
            ("log10", "1000", "", "3"),
            ("log10", "0.001", "", "-3"),
            ("log10", "2", "", "0.3010299956639811952137388947244930"),
            ("log10", "1E-6176", "", "-6176"),
            ("log10", "10", "", "1"),
            ("log10", "1", "", "0"),
            ("log10", "5", "", "0.6989700043360188047862611052755070"),
            ("log10", "1E+6111", "", "6111"),
            ("log10", "0.2", "", "-0.6989700043360188047862611052755070"),
            (
                "log10",
                "12345678901234567890",
                "",
                "19.09151497721269989570648733341529",
            ),
            ("log10", "1.00", "", "0"),
            ("log10", "Infinity", "", "Infinity"),
            ("log10", "0", "", "-Infinity"),
            ("log10", "NaN", "", "NaN"),
            ("log", "8", "2", "3"),
            ("log", "100", "10", "2"),
            ("log", "8", "3", "0.6931471805599453094172321214581767"),
            ("log", "10", "0.5", "4.605170185988091368035982909368728"),
            ("log", "1024", "2", "10"),
            ("log", "0.125", "2", "-3"),
            ("log", "5", "2", "2.321928094887362347870319429489390"),
            ("log", "1000", "10.0", "3"),
            ("log", "7", "7", "0.2779871641507590435864789633490257"),
            (
                "log",
                "2",
                "1E+10",
                "6.931471805599453094172321214581766E-11",
            ),
            ("pow", "2", "10", "1024.000000000000000000000000000000"),
            ("pow", "2", "0.5", "1.414213562373095048801688724209698"),
            ("pow", "10", "3", "1000.000000000000000000000000000000"),
            ("pow", "10", "-2", "0.01000000000000000000000000000000000"),
            ("pow", "10", "0.5", "3.162277660168379331998893544432719"),
            ("pow", "1.1", "2", "1.210000000000000000000000000000000"),
            ("pow", "3", "40", "12157665459056928801.00000000000000"),
            ("pow", "-2", "3", "-8.000000000000000000000000000000000"),
            ("pow", "-8", "0.3333", "NaN"),
            (
                "pow",
                "0.5",
                "100",
                "7.888609052210118054117285652827862E-31",
            ),
            ("pow", "2", "-1", "0.5000000000000000000000000000000000"),
            ("pow", "7", "1.5", "18.52025917745213413351131027547482"),
            (
                "pow",
                "1.000001",
                "1000000",
                "2.718280469319376883819799708454356",
            ),
            ("pow", "9.99", "9999", "Infinity"),
            ("pow", "0", "5", "0E-6176"),
            (
                "pow",
                "2",
                "20000",
                "3.980276840337966592354307206191202E+6020",
            ),
            ("pow", "0.1", "20000", "0E-6176"),
            ("pow", "-2", "-3", "-0.1250000000000000000000000000000000"),
            (
                "pow",
                "123.456",
                "-7.89",
                "3.147521672492617440467513336202788E-17",
            ),
            ("pow", "2", "1E-50", "1.000000000000000000000000000000000"),
            ("pow", "1E+6000", "2", "Infinity"),
            ("pow", "-1.5", "2", "2.250000000000000000000000000000000"),
            ("pow", "0.9", "1E+8", "0E-6176"),
            ("pow", "5", "0", "1.000000000000000000000000000000000"),
            ("pow", "NaN", "0", "1.000000000000000000000000000000000"),
            ("pow", "1", "NaN", "1.000000000000000000000000000000000"),
            ("pow", "1", "1E+100", "1.000000000000000000000000000000000"),
            (
                "pow",
                "-1",
                "Infinity",
                "1.000000000000000000000000000000000",
            ),
            ("pow", "Infinity", "-2", "0E-6176"),
            ("pow", "Infinity", "0.5", "Infinity"),
            ("pow", "-Infinity", "3", "-Infinity"),
            ("pow", "0.5", "Infinity", "0E-6176"),
            ("pow", "2", "-Infinity", "0E-6176"),
            ("pow", "-0", "3", "0E-6176"),
            ("pow", "NaN", "2", "NaN"),
        ];
        let mut wrong = Vec::new();
        for (op, a, b, want) in cases {
            let x = d(a);
            let got = match op {
                "sqrt" => x.sqrt(),
                "exp" => x.exp(),
                "ln" => x.ln(),
                "log10" => x.log10(),
                "log" => x.log_base(d(b)),
                _ => x.power(d(b)),
            };
            let got = got.to_decimal128().to_string();
            if got != want {
                wrong.push(format!("{op}({a}, {b}) = {got}, want {want}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// 700 random operands (math_cases.txt, made with Python's `decimal` module as above).
    #[test]
    fn random_operands_match_correctly_rounded_decimal128() {
        let mut wrong = Vec::new();
        let mut count = 0;
        for line in include_str!("math_cases.txt").lines() {
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (op, x, want) = (fields[0], d(fields[1]), fields[fields.len() - 1]);
            let got = match op {
                "sqrt" => x.sqrt(),
                "exp" => x.exp(),
                "ln" => x.ln(),
                "log10" => x.log10(),
                _ => x.power(d(fields[2])),
            };
            count += 1;
            let got = got.to_decimal128().to_string();
            if got != want {
                wrong.push(format!("{line}: got {got}"));
            }
        }
        assert_eq!(count, 700);
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn wide_naturals_multiply_divide_and_print_exactly() {
        let a = Nat::from_digits(&[9; 40]);
        let b = Nat::from_digits(&[9; 40]);
        // (10^40 - 1)^2 = 10^80 - 2·10^40 + 1.
        let mut want = vec![9u8; 39];
        want.push(8);
        want.extend(std::iter::repeat_n(0, 39));
        want.push(1);
        assert_eq!(a.mul(&b).digits(), want);
        assert_eq!(
            a.mul(&b).div_pow10(40).add(&Nat::from_u128(1)).digits(),
            vec![9; 40]
        );
        assert_eq!(isqrt(&a.mul(&b)).digits(), vec![9; 40]);
        assert_eq!(Nat::from_u128(10).times_pow10(20).digits().len(), 22);
    }
}
