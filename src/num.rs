//! Checked numeric conversions: where a number someone wrote (a script value, a model-language
//! literal, a checkpoint entry) changes type, it goes through here, so nothing wraps, saturates
//! or silently becomes infinite. The errors are message fragments; callers name the value and
//! give the error its kind and position.

/// `v` as an integer type, when it lies in `min..=max` (which must fit in `T`).
pub fn int_in<T: TryFrom<i64>>(v: i64, min: i64, max: i64) -> Result<T, String> {
    if (min..=max).contains(&v) {
        if let Ok(t) = T::try_from(v) {
            return Ok(t);
        }
    }
    Err(if max == i64::MAX {
        format!("must be an integer >= {min}, got {v}")
    } else {
        format!("must be an integer in {min}..={max}, got {v}")
    })
}

/// `v` as f32. A finite number outside f32's range is an error (it would become infinite);
/// infinities and NaN stay what they are, and numbers too small for f32 round to zero, as
/// every float rounds.
pub fn f32_of(v: f64) -> Result<f32, String> {
    let f = v as f32;
    if v.is_finite() && f.is_infinite() {
        return Err(format!("{v:e} is outside the range of f32 (about ±3.4e38)"));
    }
    Ok(f)
}

/// The largest integer below which f32 holds every integer exactly (2^24).
pub const F32_EXACT: u64 = 1 << 24;

/// An integer someone wrote as f32, when f32 holds it exactly (every integer up to 2^24, and
/// only some beyond): an integer is meant exactly, so rounding 16777217 to 16777216 is an
/// error, not a silently different number. A float that rounds is a float ([`f32_of`]).
pub fn f32_of_int(v: i64) -> Result<f32, String> {
    let f = v as f32;
    if f as i128 == i128::from(v) {
        return Ok(f);
    }
    Err(format!(
        "{v} has no exact f32 value (f32 holds every integer up to {F32_EXACT} = 2^24, and only some beyond)"
    ))
}

/// `v` as i32, when it is a whole number in i32's range (NaN, infinities and fractions are
/// errors).
pub fn i32_of(v: f64) -> Result<i32, String> {
    if v.fract() == 0.0 && v >= i32::MIN as f64 && v <= i32::MAX as f64 {
        Ok(v as i32)
    } else {
        Err(format!("{v} is not a whole number in i32's range ({}..={})", i32::MIN, i32::MAX))
    }
}

/// The smallest `eps` (a number added to keep a divisor or a square root's argument off zero:
/// LayerNorm's and batch norm's `var + eps`, Adam's `sqrt(v) + eps`): f32's smallest normal
/// number, 1.1754944e-38. A GPU may flush a subnormal f32 to zero (WGSL allows it), so a smaller
/// eps, nonzero on the CPU, could divide a constant row by zero there.
pub const MIN_EPS: f32 = f32::MIN_POSITIVE;

/// `v` as an `eps` applied in f32: finite and, as an f32, at least [`MIN_EPS`]. The error is the
/// fragment after the name ("must be ..."), showing `v` as given (1e-50, not the 0 it rounds to).
pub fn eps_f32<T>(v: T) -> Result<f32, String>
where
    T: Copy + Into<f64> + std::fmt::Display + std::fmt::LowerExp,
{
    let f = v.into() as f32;
    if f.is_finite() && f >= MIN_EPS {
        return Ok(f);
    }
    Err(format!(
        "must be a finite number of at least {} (the smallest normal f32: a GPU may flush a smaller one to 0), got {}",
        show(MIN_EPS),
        show(v)
    ))
}

/// A number for a message: as written for everyday magnitudes, in exponent form for very large
/// or very small ones (so 1e39 does not print as forty digits). An f32 is shown as an f32 (0.1,
/// not the 0.10000000149011612 it widens to).
pub fn show<T>(v: T) -> String
where
    T: Copy + Into<f64> + std::fmt::Display + std::fmt::LowerExp,
{
    let x: f64 = v.into();
    if x == 0.0 || !x.is_finite() || (1e-4..1e16).contains(&x.abs()) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the hostile-input hunt: an eps of 1e-40 is nonzero in f32 but subnormal, which a
    /// GPU may flush to 0 (NaN on a constant row where the CPU is finite).
    #[test]
    fn an_eps_is_a_normal_f32() {
        let fragment = |got: &str| {
            format!("must be a finite number of at least 1.1754944e-38 (the smallest normal f32: a GPU may flush a smaller one to 0), got {got}")
        };
        assert_eq!(eps_f32(1e-5), Ok(1e-5));
        assert_eq!(eps_f32(f32::MIN_POSITIVE), Ok(f32::MIN_POSITIVE));
        assert_eq!(eps_f32(f64::from(f32::MIN_POSITIVE)), Ok(f32::MIN_POSITIVE));
        assert_eq!(eps_f32(1e-40), Err(fragment("1e-40")));
        assert_eq!(eps_f32(1e-40f32), Err(fragment("1e-40")));
        assert_eq!(eps_f32(1e-50), Err(fragment("1e-50")));
        assert_eq!(eps_f32(1.1754942e-38f32), Err(fragment("1.1754942e-38")));
        assert_eq!(eps_f32(0.0), Err(fragment("0")));
        assert_eq!(eps_f32(-1.0), Err(fragment("-1")));
        assert_eq!(eps_f32(1e39), Err(fragment("1e39")));
        assert_eq!(eps_f32(f64::NAN), Err(fragment("NaN")));
        assert_eq!(eps_f32(f64::INFINITY), Err(fragment("inf")));
    }

    #[test]
    fn conversions_refuse_what_they_cannot_keep() {
        assert_eq!(int_in::<i32>(-5, i32::MIN.into(), i32::MAX.into()), Ok(-5));
        assert_eq!(
            int_in::<i32>(4294967296, i32::MIN.into(), i32::MAX.into()),
            Err("must be an integer in -2147483648..=2147483647, got 4294967296".into())
        );
        assert_eq!(int_in::<u64>(-1, 0, i64::MAX), Err("must be an integer >= 0, got -1".into()));
        assert_eq!(f32_of(1e39), Err("1e39 is outside the range of f32 (about ±3.4e38)".into()));
        assert_eq!(
            f32_of(-1e300),
            Err("-1e300 is outside the range of f32 (about ±3.4e38)".into())
        );
        assert_eq!(f32_of(f64::INFINITY), Ok(f32::INFINITY));
        assert_eq!(
            (show(1e39), show(0.9), show(-2.5e-7), show(0.0)),
            ("1e39".into(), "0.9".into(), "-2.5e-7".into(), "0".into())
        );
        assert!(f32_of(f64::NAN).unwrap().is_nan());
        assert_eq!(f32_of_int(-16777216), Ok(-16777216.0));
        assert_eq!(f32_of_int(16777218), Ok(16777218.0));
        assert_eq!(f32_of_int(i64::MIN), Ok(-9223372036854775808.0));
        assert_eq!(
            f32_of_int(16777217),
            Err("16777217 has no exact f32 value (f32 holds every integer up to 16777216 = 2^24, and only some beyond)".into())
        );
        assert!(f32_of_int(i64::MAX).is_err());
        assert_eq!(f32_of(1e-50), Ok(0.0));
        assert_eq!(f32_of(3.4e38), Ok(3.4e38));
        assert_eq!(i32_of(-7.0), Ok(-7));
        for bad in [1.5, 4294967297.0, f64::NAN, f64::INFINITY] {
            assert!(i32_of(bad).is_err(), "{bad}");
        }
    }
}
