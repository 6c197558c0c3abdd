//! Decimal128 arithmetic checked against known results. The expected strings were computed
//! with Python's `decimal` module in the decimal128 context (prec=34, ROUND_HALF_EVEN,
//! Emin=-6143, Emax=6144, clamp=1), whose arithmetic is IEEE 754-2008's; the conversions of
//! doubles follow mongod's documented outputs (`$toDecimal: 2.5` is `2.50000000000000`).

use super::*;

fn d(s: &str) -> Dec {
    Dec::from_decimal128(&s.parse::<Decimal128>().expect("test literal"))
}

fn text(v: Dec) -> String {
    v.to_decimal128().to_string()
}

#[test]
fn arithmetic_matches_ieee_decimal128() {
    let cases = [
        ("add", "0.1", "0.2", "0.3"),
        ("add", "1.10", "2.20", "3.30"),
        ("add", "9223372036854775807", "0.5", "9223372036854775807.5"),
        ("add", "1", "1E-40", "1.000000000000000000000000000000000"),
        (
            "add",
            "9999999999999999999999999999999999",
            "1",
            "1.000000000000000000000000000000000E+34",
        ),
        (
            "add",
            "1E+40",
            "-1",
            "1.000000000000000000000000000000000E+40",
        ),
        ("add", "1.000000000000000000000000000000001", "-1", "1E-33"),
        ("add", "-0", "0", "0"),
        ("add", "-0", "-0", "-0"),
        ("add", "0E+5", "1.23", "1.23"),
        ("add", "1E+6111", "9E+6111", "1.0E+6112"),
        ("add", "1", "-1", "0"),
        ("add", "1.00", "-1", "0.00"),
        (
            "add",
            "123456789012345678901234567890123.5",
            "0.05",
            "123456789012345678901234567890123.6",
        ),
        (
            "add",
            "123456789012345678901234567890123.4",
            "0.05",
            "123456789012345678901234567890123.4",
        ),
        ("add", "5E-6176", "5E-6176", "1.0E-6175"),
        (
            "add",
            "1234567890123456789012345678901234",
            "0.5",
            "1234567890123456789012345678901234",
        ),
        (
            "add",
            "1234567890123456789012345678901235",
            "0.5",
            "1234567890123456789012345678901236",
        ),
        (
            "add",
            "1234567890123456789012345678901234",
            "0.50000000000000000001",
            "1234567890123456789012345678901235",
        ),
        (
            "add",
            "1E+100",
            "1E-100",
            "1.000000000000000000000000000000000E+100",
        ),
        (
            "add",
            "-1E+100",
            "1E-100",
            "-1.000000000000000000000000000000000E+100",
        ),
        ("add", "0E-10", "1", "1.0000000000"),
        ("sub", "0.3", "0.1", "0.2"),
        ("sub", "1", "0.0001", "0.9999"),
        ("mul", "1.10", "2.20", "2.4200"),
        ("mul", "0.1", "0.1", "0.01"),
        (
            "mul",
            "9999999999999999999999999999999999",
            "9999999999999999999999999999999999",
            "9.999999999999999999999999999999998E+67",
        ),
        ("mul", "1E+6000", "1E+6000", "Infinity"),
        ("mul", "1E-6000", "1E-6000", "0E-6176"),
        ("mul", "-2", "0", "-0"),
        ("mul", "1.5", "0", "0.0"),
        ("mul", "123456789", "987654321", "121932631112635269"),
        ("mul", "1E-6176", "0.5", "0E-6176"),
        ("mul", "3E-6176", "0.5", "2E-6176"),
        ("div", "1", "3", "0.3333333333333333333333333333333333"),
        ("div", "2", "3", "0.6666666666666666666666666666666667"),
        ("div", "1", "4", "0.25"),
        ("div", "6", "2", "3"),
        ("div", "1E+2", "4", "25"),
        ("div", "1.0", "4", "0.25"),
        ("div", "10", "4", "2.5"),
        ("div", "-1", "7", "-0.1428571428571428571428571428571429"),
        ("div", "0", "5", "0"),
        ("div", "0.00", "1E+5", "0E-7"),
        ("div", "1E-6000", "1E+6000", "0E-6176"),
        ("div", "1E+6000", "1E-6000", "Infinity"),
        ("div", "12", "12", "1"),
        ("div", "2.400", "2", "1.200"),
        ("div", "9223372036854775807", "1", "9223372036854775807"),
        ("div", "1E-6176", "2", "0E-6176"),
        ("div", "7E-6170", "3E+5", "2.3E-6175"),
        ("rem", "10", "3", "1"),
        ("rem", "-10", "3", "-1"),
        ("rem", "10.5", "3", "1.5"),
        ("rem", "1E+10", "7", "4"),
        ("rem", "5", "0.5", "0.0"),
        ("rem", "7", "1E+40", "7"),
        ("rem", "5.5", "-2", "1.5"),
    ];
    for (op, a, b, want) in cases {
        let (x, y) = (d(a), d(b));
        let got = match op {
            "add" => x.plus(y),
            "sub" => x.minus(y),
            "mul" => x.times(y),
            "div" => x.divided_by(y).expect("nonzero divisor"),
            _ => x.remainder(y).expect("nonzero divisor"),
        };
        assert_eq!(text(got), want, "{a} {op} {b}");
    }
}

#[test]
fn quantize_rounds_by_mode() {
    let cases = [
        ("1.2345", -2, Rounding::HalfEven, "1.23"),
        ("1.235", -2, Rounding::HalfEven, "1.24"),
        ("1.245", -2, Rounding::HalfEven, "1.24"),
        ("-1.2399", -2, Rounding::TowardZero, "-1.23"),
        ("1234", 2, Rounding::HalfEven, "1.2E+3"),
        ("1.5", -3, Rounding::HalfEven, "1.500"),
        ("1.1", 0, Rounding::Ceiling, "2"),
        ("-1.1", 0, Rounding::Ceiling, "-1"),
        ("-1.1", 0, Rounding::Floor, "-2"),
        ("1.9", 0, Rounding::Floor, "1"),
        ("-0.5", 0, Rounding::Ceiling, "-0"),
        ("1E+2", 0, Rounding::Ceiling, "100"),
        ("2.5", 0, Rounding::HalfEven, "2"),
        ("3.5", 0, Rounding::HalfEven, "4"),
        ("9.99", -1, Rounding::HalfEven, "10.0"),
        // More than 34 digits at the requested exponent: IEEE's invalid operation.
        ("1E+40", 0, Rounding::HalfEven, "NaN"),
        ("Infinity", 0, Rounding::Floor, "Infinity"),
    ];
    for (v, exp, mode, want) in cases {
        assert_eq!(
            text(d(v).quantize(exp, mode)),
            want,
            "{v} at 1E{exp} {mode:?}"
        );
    }
}

#[test]
fn specials_propagate_and_zero_divisors_are_refused() {
    let (nan, inf, ninf, one, zero) = (d("NaN"), d("Infinity"), d("-Infinity"), d("1"), d("0"));
    assert_eq!(one.plus(nan), Dec::NaN);
    assert_eq!(inf.plus(one), inf);
    assert_eq!(inf.plus(ninf), Dec::NaN);
    assert_eq!(inf.times(zero), Dec::NaN);
    assert_eq!(ninf.times(d("-2")), inf);
    assert_eq!(one.divided_by(inf).map(text), Ok("0E-6176".to_string()));
    assert_eq!(inf.divided_by(inf), Ok(Dec::NaN));
    assert_eq!(one.divided_by(zero), Err(DecError::DivideByZero));
    assert_eq!(nan.divided_by(d("-0.00")), Err(DecError::DivideByZero));
    assert_eq!(one.remainder(zero), Err(DecError::DivideByZero));
    assert_eq!(inf.remainder(one), Ok(Dec::NaN));
    assert_eq!(d("2.5").remainder(inf), Ok(d("2.5")));
    assert_eq!(d("-Infinity").abs(), inf);
    assert_eq!(text(d("-1.50").abs()), "1.50");
}

#[test]
fn bid_encoding_round_trips_and_reads_noncanonical_forms_as_zero() {
    for s in [
        "0",
        "-0",
        "1",
        "-1.50",
        "0.3",
        "9999999999999999999999999999999999",
        "1E+6111",
        "1E-6176",
        "9.999999999999999999999999999999999E+6144",
        "NaN",
        "Infinity",
        "-Infinity",
    ] {
        let original: Decimal128 = s.parse().expect("literal");
        let back = Dec::from_decimal128(&original).to_decimal128();
        assert_eq!(back.bytes(), original.bytes(), "{s}");
    }
    // The large-coefficient form (combination bits 11, not special) is never canonical.
    let large = (0b11u128 << 125) | ((BIAS as u128) << 111) | 5;
    let v = Dec::from_decimal128(&Decimal128::from_bytes(large.to_le_bytes()));
    assert_eq!(v, Dec::ZERO);
    // A small-form coefficient of 10^34 or more is not canonical either.
    let big = ((BIAS as u128) << 113) | COEF_LIMIT;
    assert!(Dec::from_decimal128(&Decimal128::from_bytes(big.to_le_bytes())).is_zero());
}

#[test]
fn conversions_follow_mongod() {
    assert_eq!(text(Dec::from_f64(2.5, 15)), "2.50000000000000");
    assert_eq!(text(Dec::from_f64(0.1, 15)), "0.100000000000000");
    assert_eq!(text(Dec::from_f64(1.0 / 3.0, 15)), "0.333333333333333");
    assert_eq!(text(Dec::from_f64(-123.456, 15)), "-123.456000000000");
    assert_eq!(text(Dec::from_f64(1e300, 15)), "1.00000000000000E+300");
    assert_eq!(text(Dec::from_f64(5e-324, 15)), "4.94065645841247E-324");
    assert_eq!(
        text(Dec::from_f64(0.1, 34)),
        "0.1000000000000000055511151231257827"
    );
    assert_eq!(text(Dec::from_i64(i64::MIN)), "-9223372036854775808");
    assert_eq!(
        text(Dec::from_i64(i64::MAX).plus(d("0.5"))),
        "9223372036854775807.5"
    );
    assert_eq!(d("1.5E-3").to_f64(), 0.0015);
    assert_eq!(d("-Infinity").to_f64(), f64::NEG_INFINITY);
}

#[test]
fn comparison_is_by_exact_value() {
    use std::cmp::Ordering::*;
    assert_eq!(d("1.0").total_cmp(d("1")), Equal);
    assert_eq!(d("-0").total_cmp(d("0E+5")), Equal);
    assert_eq!(d("NaN").total_cmp(d("-Infinity")), Less);
    assert_eq!(d("NaN").total_cmp(d("NaN")), Equal);
    assert_eq!(
        d("0.30000000000000000000000000000001").total_cmp(d("0.3")),
        Greater
    );
    assert_eq!(d("-2").total_cmp(d("-10")), Greater);
    assert_eq!(d("1E+2").total_cmp(d("99.99")), Greater);
    assert_eq!(d("9E-6176").total_cmp(d("1E-6175")), Less);
    assert_eq!(
        d("Infinity").total_cmp(d("9.999999999999999999999999999999999E+6144")),
        Greater
    );
}
