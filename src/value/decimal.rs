//! IEEE 754-2008 decimal128 arithmetic, as mongod computes whenever an operand is a
//! `NumberDecimal`: 34 significant digits, exponents -6176..=6111 (the clamped form), results
//! rounded half to even, NaN and ±Infinity propagated.
//!
//! [`Dec`] is a decoded `bson::Decimal128` (BID encoding, including the large-coefficient form,
//! which holds no canonical value and so reads as zero). Sums are exact in `u128` before
//! rounding; products and quotients are formed as decimal digit strings, then rounded once.
//! Conversions follow mongod's: an integer converts exactly, a double to 15 significant digits
//! when it meets a decimal in arithmetic (`coerceToDecimal`) and to 34 when compared.

use std::cmp::Ordering;

use bson::{Bson, Decimal128};

/// Significant digits a decimal128 holds.
const PRECISION: usize = 34;
/// Smallest exponent (of the coefficient's last digit).
const MIN_EXP: i32 = -6176;
/// Largest exponent (of the coefficient's last digit, the clamped form).
const MAX_EXP: i32 = 6111;
/// Exponent bias of the BID encoding.
const BIAS: i32 = 6176;
/// 10^34: one more than the largest coefficient.
const COEF_LIMIT: u128 = 10u128.pow(PRECISION as u32);

/// How a result that does not fit is rounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// To nearest, ties to the even digit (every arithmetic operator, `$round`).
    HalfEven,
    /// Toward zero (`$trunc`).
    TowardZero,
    /// Toward +Infinity (`$ceil`).
    Ceiling,
    /// Toward -Infinity (`$floor`).
    Floor,
}

/// A decoded decimal128 value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dec {
    /// Not a number (quiet or signalling; mongod keeps no distinction).
    NaN,
    /// ±Infinity.
    Inf { neg: bool },
    /// `(-1)^neg × coef × 10^exp`, `coef < 10^34`.
    Finite { neg: bool, coef: u128, exp: i32 },
}

/// Errors of arithmetic that mongod reports instead of returning a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecError {
    /// A divisor (of `$divide` or `$mod`) was zero.
    DivideByZero,
}

impl Dec {
    /// Zero with exponent 0.
    pub const ZERO: Dec = Dec::Finite {
        neg: false,
        coef: 0,
        exp: 0,
    };

    /// Decodes the BID encoding.
    pub fn from_decimal128(d: &Decimal128) -> Dec {
        let bits = u128::from_le_bytes(d.bytes());
        let neg = bits >> 127 == 1;
        let (coef, biased) = if (bits >> 125) & 0b11 == 0b11 {
            match (bits >> 122) & 0b11111 {
                0b11111 => return Dec::NaN,
                0b11110 => return Dec::Inf { neg },
                // The large-coefficient form: 2^113 and above, never a canonical value.
                _ => (0, ((bits >> 111) & 0x3fff) as i32),
            }
        } else {
            let coef = bits & ((1u128 << 113) - 1);
            let coef = if coef >= COEF_LIMIT { 0 } else { coef };
            (coef, ((bits >> 113) & 0x3fff) as i32)
        };
        Dec::Finite {
            neg,
            coef,
            exp: biased - BIAS,
        }
    }

    /// Encodes in BID (always the small-coefficient form: every coefficient is below 10^34).
    pub fn to_decimal128(self) -> Decimal128 {
        let bits: u128 = match self {
            Dec::NaN => 0x7c00u128 << 112,
            Dec::Inf { neg } => (0x7800u128 << 112) | (u128::from(neg) << 127),
            Dec::Finite { neg, coef, exp } => {
                (u128::from(neg) << 127) | (((exp + BIAS) as u128) << 113) | coef
            }
        };
        Decimal128::from_bytes(bits.to_le_bytes())
    }

    /// The value as a BSON decimal.
    pub fn to_bson(self) -> Bson {
        Bson::Decimal128(self.to_decimal128())
    }

    /// An integer, exactly.
    pub fn from_i64(i: i64) -> Dec {
        Dec::Finite {
            neg: i < 0,
            coef: i.unsigned_abs() as u128,
            exp: 0,
        }
    }

    /// A double rounded to `digits` significant digits (15 as mongod's `coerceToDecimal`, 34
    /// for comparisons), half to even.
    pub fn from_f64(f: f64, digits: usize) -> Dec {
        if f.is_nan() {
            return Dec::NaN;
        }
        if f.is_infinite() {
            return Dec::Inf { neg: f < 0.0 };
        }
        let neg = f.is_sign_negative();
        if f == 0.0 {
            return Dec::Finite {
                neg,
                coef: 0,
                exp: 0,
            };
        }
        // `{:.Ne}` is exact decimal formatting of the binary value, correctly rounded.
        let text = format!("{:.*e}", digits.saturating_sub(1), f.abs());
        let (mantissa, e) = text.split_once('e').unwrap_or((text.as_str(), "0"));
        let e: i32 = e.parse().unwrap_or(0);
        let digits_only: Vec<u8> = mantissa
            .bytes()
            .filter(u8::is_ascii_digit)
            .map(|b| b - b'0')
            .collect();
        let exp = e - (digits_only.len() as i32 - 1);
        finish(neg, digits_only, exp, false, Rounding::HalfEven, MIN_EXP)
    }

    /// A numeric BSON value as mongod coerces it for decimal arithmetic (`coerceToDecimal`):
    /// integers exactly, doubles to 15 digits. `None` for other types.
    pub fn coerce(v: &Bson) -> Option<Dec> {
        match v {
            Bson::Int32(i) => Some(Dec::from_i64(*i as i64)),
            Bson::Int64(i) => Some(Dec::from_i64(*i)),
            Bson::Double(f) => Some(Dec::from_f64(*f, 15)),
            Bson::Decimal128(d) => Some(Dec::from_decimal128(d)),
            _ => None,
        }
    }

    /// A numeric BSON value as mongod widens it to compare with a decimal: integers exactly,
    /// doubles to 34 digits. `None` for other types.
    pub fn for_comparison(v: &Bson) -> Option<Dec> {
        match v {
            Bson::Double(f) => Some(Dec::from_f64(*f, PRECISION)),
            other => Dec::coerce(other),
        }
    }

    /// Whether the value is a zero of either sign and any exponent.
    pub fn is_zero(self) -> bool {
        matches!(self, Dec::Finite { coef: 0, .. })
    }

    /// Whether the value is NaN.
    pub fn is_nan(self) -> bool {
        matches!(self, Dec::NaN)
    }

    /// The value with its sign flipped (NaN stays NaN).
    pub fn negate(self) -> Dec {
        match self {
            Dec::NaN => Dec::NaN,
            Dec::Inf { neg } => Dec::Inf { neg: !neg },
            Dec::Finite { neg, coef, exp } => Dec::Finite {
                neg: !neg,
                coef,
                exp,
            },
        }
    }

    /// The absolute value (`$abs`).
    pub fn abs(self) -> Dec {
        match self {
            Dec::NaN => Dec::NaN,
            Dec::Inf { .. } => Dec::Inf { neg: false },
            Dec::Finite { coef, exp, .. } => Dec::Finite {
                neg: false,
                coef,
                exp,
            },
        }
    }

    /// `self + other`, rounded half to even.
    pub fn plus(self, other: Dec) -> Dec {
        let (
            Dec::Finite {
                neg: na,
                coef: ca,
                exp: ea,
            },
            Dec::Finite {
                neg: nb,
                coef: cb,
                exp: eb,
            },
        ) = (self, other)
        else {
            return match (self, other) {
                (Dec::NaN, _) | (_, Dec::NaN) => Dec::NaN,
                (Dec::Inf { neg: x }, Dec::Inf { neg: y }) if x != y => Dec::NaN,
                (Dec::Inf { neg }, _) | (_, Dec::Inf { neg }) => Dec::Inf { neg },
                _ => Dec::NaN,
            };
        };
        // `a` is the operand with the larger exponent.
        let ((na, ca, ea), (nb, cb, eb)) = if ea >= eb {
            ((na, ca, ea), (nb, cb, eb))
        } else {
            ((nb, cb, eb), (na, ca, ea))
        };
        if ca == 0 {
            // Exact: the other operand at its own (the smaller) exponent.
            let neg = if cb == 0 { na && nb } else { nb };
            return Dec::Finite {
                neg,
                coef: cb,
                exp: eb,
            };
        }
        let shift = (ea - eb) as u32;
        let k = shift.min(37 - digit_count(ca));
        let (xa, xb, exp, exact) = if shift == k {
            // Aligned exactly at `eb`: ca·10^k < 10^37.
            (ca * 10u128.pow(k), cb, eb, true)
        } else {
            // `a` scaled to 38 digits; `b`, scaled down, only decides the rounding: its
            // dropped digits become a sticky 1 below the last digit kept.
            let down = shift - k;
            let (q, sticky) = if down > 34 {
                (0, cb != 0)
            } else {
                let p = 10u128.pow(down);
                (cb / p, cb % p != 0)
            };
            (
                ca * 10u128.pow(k + 1),
                q * 10 + u128::from(sticky),
                eb + down as i32 - 1,
                false,
            )
        };
        let (neg, sum) = if na == nb {
            (na, xa + xb)
        } else if xa >= xb {
            (na, xa - xb)
        } else {
            (nb, xb - xa)
        };
        if sum == 0 && exact {
            return Dec::Finite {
                neg: na && nb,
                coef: 0,
                exp: eb,
            };
        }
        finish(neg, digits_of(sum), exp, false, Rounding::HalfEven, MIN_EXP)
    }

    /// `self - other`, rounded half to even.
    pub fn minus(self, other: Dec) -> Dec {
        self.plus(other.negate())
    }

    /// `self × other`, rounded half to even.
    pub fn times(self, other: Dec) -> Dec {
        match (self, other) {
            (Dec::NaN, _) | (_, Dec::NaN) => Dec::NaN,
            (Dec::Inf { .. }, b) | (b, Dec::Inf { .. }) if b.is_zero() => Dec::NaN,
            (Dec::Inf { neg: x }, b) | (b, Dec::Inf { neg: x }) => Dec::Inf { neg: x != b.sign() },
            (
                Dec::Finite {
                    neg: na,
                    coef: ca,
                    exp: ea,
                },
                Dec::Finite {
                    neg: nb,
                    coef: cb,
                    exp: eb,
                },
            ) => {
                let (da, db) = (digits_of(ca), digits_of(cb));
                let mut product = vec![0u32; da.len() + db.len()];
                for (i, x) in da.iter().enumerate().rev() {
                    for (j, y) in db.iter().enumerate().rev() {
                        product[i + j + 1] += u32::from(*x) * u32::from(*y);
                    }
                }
                for i in (1..product.len()).rev() {
                    let carry = product[i] / 10;
                    product[i] %= 10;
                    product[i - 1] += carry;
                }
                let digits = product.into_iter().map(|d| d as u8).collect();
                finish(
                    na != nb,
                    digits,
                    ea + eb,
                    false,
                    Rounding::HalfEven,
                    MIN_EXP,
                )
            }
        }
    }

    /// `self ÷ other`, rounded half to even; an exact quotient keeps the exponent closest to
    /// `ea - eb`, as IEEE 754 prefers.
    pub fn divided_by(self, other: Dec) -> Result<Dec, DecError> {
        match (self, other) {
            // mongod refuses a zero divisor before looking at the dividend.
            (_, b) if b.is_zero() => Err(DecError::DivideByZero),
            (Dec::NaN, _) | (_, Dec::NaN) => Ok(Dec::NaN),
            (Dec::Inf { .. }, Dec::Inf { .. }) => Ok(Dec::NaN),
            (Dec::Inf { neg }, b) => Ok(Dec::Inf {
                neg: neg != b.sign(),
            }),
            (a, Dec::Inf { neg }) => Ok(Dec::Finite {
                neg: a.sign() != neg,
                coef: 0,
                exp: MIN_EXP,
            }),
            (
                Dec::Finite {
                    neg: na,
                    coef: ca,
                    exp: ea,
                },
                Dec::Finite {
                    neg: nb,
                    coef: cb,
                    exp: eb,
                },
            ) => {
                let neg = na != nb;
                if ca == 0 {
                    return Ok(finish(
                        neg,
                        vec![0],
                        ea - eb,
                        false,
                        Rounding::HalfEven,
                        MIN_EXP,
                    ));
                }
                let dividend = digits_of(ca);
                let mut quotient: Vec<u8> = Vec::with_capacity(40);
                let mut rem: u128 = 0;
                let mut exp = ea - eb;
                let mut i = 0;
                loop {
                    let d = match dividend.get(i) {
                        Some(d) => *d,
                        None => {
                            exp -= 1;
                            0
                        }
                    };
                    rem = rem * 10 + u128::from(d);
                    quotient.push((rem / cb) as u8);
                    rem %= cb;
                    i += 1;
                    let significant =
                        quotient.len() - quotient.iter().take_while(|d| **d == 0).count();
                    if i >= dividend.len() && (rem == 0 || significant > PRECISION) {
                        break;
                    }
                }
                Ok(finish(
                    neg,
                    quotient,
                    exp,
                    rem != 0,
                    Rounding::HalfEven,
                    MIN_EXP,
                ))
            }
        }
    }

    /// The truncated remainder `self - other × trunc(self / other)` (`$mod`, C's `fmod`): the
    /// dividend's sign, the smaller of the two exponents, always exact.
    pub fn remainder(self, other: Dec) -> Result<Dec, DecError> {
        match (self, other) {
            (_, b) if b.is_zero() => Err(DecError::DivideByZero),
            (Dec::NaN, _) | (_, Dec::NaN) | (Dec::Inf { .. }, _) => Ok(Dec::NaN),
            (a, Dec::Inf { .. }) => Ok(a),
            (
                Dec::Finite {
                    neg,
                    coef: ca,
                    exp: ea,
                },
                Dec::Finite {
                    coef: cb, exp: eb, ..
                },
            ) => {
                let coef = if ea >= eb {
                    // (ca·10^(ea-eb)) mod cb, one decimal digit at a time.
                    let mut r = ca % cb;
                    for _ in 0..(ea - eb) {
                        r = (r * 10) % cb;
                    }
                    r
                } else {
                    let shift = (eb - ea) as u32;
                    if digit_count(cb) + shift > PRECISION as u32 + 1 {
                        ca // |b| > |a|
                    } else {
                        ca % (cb * 10u128.pow(shift))
                    }
                };
                Ok(Dec::Finite {
                    neg,
                    coef,
                    exp: ea.min(eb),
                })
            }
        }
    }

    /// The value with exponent `exp`, rounded by `mode` (IEEE `quantize`: `$round`/`$trunc`
    /// with places, `$ceil`/`$floor` at exponent 0). NaN when the result would need more
    /// than 34 digits; infinities are returned unchanged.
    pub fn quantize(self, exp: i32, mode: Rounding) -> Dec {
        let Dec::Finite { neg, coef, exp: e } = self else {
            return self;
        };
        if e >= exp {
            let pad = (e - exp) as u32;
            if coef == 0 {
                return Dec::Finite { neg, coef, exp };
            }
            return if digit_count(coef) + pad > PRECISION as u32 {
                Dec::NaN
            } else {
                Dec::Finite {
                    neg,
                    coef: coef * 10u128.pow(pad),
                    exp,
                }
            };
        }
        match finish(neg, digits_of(coef), e, false, mode, exp) {
            Dec::Finite {
                neg,
                coef,
                exp: got,
            } if got == exp => Dec::Finite { neg, coef, exp },
            _ => Dec::NaN,
        }
    }

    /// The value's sign bit (false for NaN).
    fn sign(self) -> bool {
        match self {
            Dec::NaN => false,
            Dec::Inf { neg } | Dec::Finite { neg, .. } => neg,
        }
    }

    /// The value as the nearest double.
    pub fn to_f64(self) -> f64 {
        match self {
            Dec::NaN => f64::NAN,
            Dec::Inf { neg: false } => f64::INFINITY,
            Dec::Inf { neg: true } => f64::NEG_INFINITY,
            Dec::Finite { neg, coef, exp } => {
                let text = format!("{}{coef}e{exp}", if neg { "-" } else { "" });
                text.parse().unwrap_or(f64::NAN)
            }
        }
    }

    /// MongoDB's order of numbers: by exact value, NaN below everything and equal to NaN,
    /// `-0 == 0`, trailing zeros ignored (`1.0 == 1`).
    pub fn total_cmp(self, other: Dec) -> Ordering {
        // -2: -Inf, -1: negative, 0: zero, 1: positive, 2: +Inf; NaN below all.
        fn class(d: Dec) -> i32 {
            match d {
                Dec::NaN => -3,
                Dec::Inf { neg: true } => -2,
                Dec::Inf { neg: false } => 2,
                Dec::Finite { coef: 0, .. } => 0,
                Dec::Finite { neg: true, .. } => -1,
                Dec::Finite { neg: false, .. } => 1,
            }
        }
        let (x, y) = (class(self), class(other));
        if x != y || x.abs() != 1 {
            return x.cmp(&y);
        }
        let (
            Dec::Finite {
                coef: ca, exp: ea, ..
            },
            Dec::Finite {
                coef: cb, exp: eb, ..
            },
        ) = (self, other)
        else {
            return Ordering::Equal;
        };
        let (la, lb) = (digit_count(ca) as i32, digit_count(cb) as i32);
        let magnitude = (la + ea).cmp(&(lb + eb)).then_with(|| {
            // Same position of the leading digit: align the digit counts (≤ 34 each).
            let (xa, xb) = if la >= lb {
                (ca, cb * 10u128.pow((la - lb) as u32))
            } else {
                (ca * 10u128.pow((lb - la) as u32), cb)
            };
            xa.cmp(&xb)
        });
        if x < 0 {
            magnitude.reverse()
        } else {
            magnitude
        }
    }
}

/// Number of decimal digits of `c` (1 for zero).
fn digit_count(c: u128) -> u32 {
    c.checked_ilog10().map_or(1, |l| l + 1)
}

/// The decimal digits of `c`, most significant first.
fn digits_of(c: u128) -> Vec<u8> {
    c.to_string().bytes().map(|b| b - b'0').collect()
}

/// Rounds the exact value `digits × 10^exp` (plus something below its last digit when
/// `sticky`) to a decimal128: at most 34 digits, exponent at least `floor_exp` (`MIN_EXP`, or
/// a `quantize` target), overflow to ±Infinity (or the largest finite value, by `mode`).
/// Callers pass `sticky` only with at least one digit to drop.
fn finish(
    neg: bool,
    mut digits: Vec<u8>,
    mut exp: i32,
    sticky: bool,
    mode: Rounding,
    floor_exp: i32,
) -> Dec {
    let leading = digits.iter().take_while(|d| **d == 0).count();
    digits.drain(..leading);
    let n = digits.len() as i64;
    let drop = (n - PRECISION as i64)
        .max(i64::from(floor_exp) - i64::from(exp))
        .max(0);
    let mut coef: u128;
    if drop > 0 {
        let keep = (n - drop).max(0) as usize;
        let (first_dropped, rest_nonzero) = if drop <= n {
            (
                digits[keep],
                sticky || digits[keep + 1..].iter().any(|d| *d != 0),
            )
        } else {
            (0, sticky || digits.iter().any(|d| *d != 0))
        };
        coef = digits[..keep]
            .iter()
            .fold(0u128, |c, d| c * 10 + u128::from(*d));
        exp = (i64::from(exp) + drop) as i32;
        let inexact = first_dropped != 0 || rest_nonzero;
        let up = match mode {
            Rounding::HalfEven => {
                first_dropped > 5 || (first_dropped == 5 && (rest_nonzero || coef % 2 == 1))
            }
            Rounding::TowardZero => false,
            Rounding::Ceiling => !neg && inexact,
            Rounding::Floor => neg && inexact,
        };
        if up {
            coef += 1;
            if coef == COEF_LIMIT {
                coef /= 10;
                exp += 1;
            }
        }
    } else {
        coef = digits.iter().fold(0u128, |c, d| c * 10 + u128::from(*d));
    }
    if exp > MAX_EXP {
        let pad = (exp - MAX_EXP) as u32;
        if coef == 0 {
            exp = MAX_EXP;
        } else if digit_count(coef) + pad <= PRECISION as u32 {
            coef *= 10u128.pow(pad);
            exp = MAX_EXP;
        } else {
            let to_infinity = match mode {
                Rounding::HalfEven => true,
                Rounding::TowardZero => false,
                Rounding::Ceiling => !neg,
                Rounding::Floor => neg,
            };
            return if to_infinity {
                Dec::Inf { neg }
            } else {
                Dec::Finite {
                    neg,
                    coef: COEF_LIMIT - 1,
                    exp: MAX_EXP,
                }
            };
        }
    }
    Dec::Finite { neg, coef, exp }
}

/// Which arithmetic operation [`decimal_arithmetic`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Subtract,
    Multiply,
    Divide,
    Modulo,
}

/// Whether either operand is a decimal, which makes an arithmetic operation decimal128
/// arithmetic.
pub fn any_decimal(a: &Bson, b: &Bson) -> bool {
    matches!(a, Bson::Decimal128(_)) || matches!(b, Bson::Decimal128(_))
}

/// The mean of `n` values whose sum is the decimal `total`, in decimal128 (`$avg` once a
/// decimal was among the values); null for no values.
pub fn decimal_mean(total: &Decimal128, n: u64) -> Bson {
    let count = Dec::from_i64(i64::try_from(n).unwrap_or(i64::MAX));
    match Dec::from_decimal128(total).divided_by(count) {
        Ok(mean) => mean.to_bson(),
        Err(_) => Bson::Null,
    }
}

/// `a op b` in decimal128, both coerced as mongod coerces them (`None` unless both are
/// numbers); the result is always a decimal.
pub fn decimal_arithmetic(a: &Bson, b: &Bson, op: Op) -> Option<Result<Bson, DecError>> {
    let (x, y) = (Dec::coerce(a)?, Dec::coerce(b)?);
    Some(
        match op {
            Op::Add => Ok(x.plus(y)),
            Op::Subtract => Ok(x.minus(y)),
            Op::Multiply => Ok(x.times(y)),
            Op::Divide => x.divided_by(y),
            Op::Modulo => x.remainder(y),
        }
        .map(Dec::to_bson),
    )
}

mod math;

#[cfg(test)]
mod tests;
