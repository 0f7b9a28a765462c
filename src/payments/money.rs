//! Exact money: integer minor units inside, decimal strings at the edges, never a float.

use std::fmt;

/// An ISO 4217 currency this service accepts, with its number of minor digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Currency {
    code: &'static str,
    exponent: u8,
}

/// The currencies we take. A currency not listed here is refused with a 400 naming it,
/// because charging in a currency whose minor digits we do not know cannot be exact.
const CURRENCIES: &[Currency] = &[
    Currency::new("AUD", 2),
    Currency::new("BHD", 3),
    Currency::new("BRL", 2),
    Currency::new("CAD", 2),
    Currency::new("CHF", 2),
    Currency::new("CNY", 2),
    Currency::new("CZK", 2),
    Currency::new("DKK", 2),
    Currency::new("EUR", 2),
    Currency::new("GBP", 2),
    Currency::new("HKD", 2),
    Currency::new("INR", 2),
    Currency::new("JPY", 0),
    Currency::new("KRW", 0),
    Currency::new("KWD", 3),
    Currency::new("MXN", 2),
    Currency::new("NOK", 2),
    Currency::new("NZD", 2),
    Currency::new("PLN", 2),
    Currency::new("SEK", 2),
    Currency::new("SGD", 2),
    Currency::new("USD", 2),
    Currency::new("ZAR", 2),
];

impl Currency {
    pub const USD: Currency = Currency::new("USD", 2);

    const fn new(code: &'static str, exponent: u8) -> Self {
        Currency { code, exponent }
    }

    /// Looks a code up, case-insensitively (`usd` is `USD`).
    pub fn parse(code: &str) -> Result<Currency, CurrencyError> {
        CURRENCIES
            .iter()
            .find(|c| c.code.eq_ignore_ascii_case(code))
            .copied()
            .ok_or_else(|| CurrencyError(code.chars().take(16).collect()))
    }

    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The codes of every currency taken, for the API's documentation.
    pub fn codes() -> impl Iterator<Item = &'static str> {
        CURRENCIES.iter().map(|c| c.code)
    }

    /// The most minor digits any currency taken has (3, for BHD and KWD).
    pub fn most_minor_digits() -> u8 {
        CURRENCIES.iter().map(|c| c.exponent).max().unwrap_or(0)
    }

    /// Number of digits after the decimal point (2 for USD, 0 for JPY, 3 for KWD).
    pub fn exponent(&self) -> u8 {
        self.exponent
    }

    fn scale(&self) -> i64 {
        10_i64.pow(u32::from(self.exponent))
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown currency {0:?}: supported are {list}", list = supported_list())]
pub struct CurrencyError(String);

fn supported_list() -> String {
    CURRENCIES
        .iter()
        .map(|c| c.code)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A positive amount of one currency, held as integer minor units (cents for USD).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Money {
    minor: i64,
    currency: Currency,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("must not be empty")]
    Empty,
    #[error("{0:?} is not a plain decimal number such as 42.50")]
    NotADecimal(String),
    #[error("must be greater than zero, got {0}")]
    NotPositive(String),
    #[error(
        "{amount} has more than {digits} digit(s) after the decimal point, the most {currency} allows"
    )]
    TooPrecise {
        amount: String,
        digits: u8,
        currency: &'static str,
    },
    #[error("{0} is too large to be an amount")]
    Unrepresentable(String),
    #[error("{amount} is above the maximum of {max} {currency}")]
    TooLarge {
        amount: String,
        max: u64,
        currency: &'static str,
    },
}

impl Money {
    /// Parses a plain decimal (`42.50`, `7`, `0.29`) into exact minor units.
    ///
    /// No sign, no exponent, no thousands separators, at most the currency's minor digits.
    pub fn parse(text: &str, currency: Currency) -> Result<Money, AmountError> {
        if text.is_empty() {
            return Err(AmountError::Empty);
        }
        let not_decimal = || AmountError::NotADecimal(text.chars().take(40).collect());
        let unsigned = match text.strip_prefix('-') {
            Some(rest) if is_decimal(rest) => {
                return Err(AmountError::NotPositive(text.to_owned()));
            }
            Some(_) => return Err(not_decimal()),
            None => text,
        };
        if !is_decimal(unsigned) {
            return Err(not_decimal());
        }
        let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
        if fraction.len() > usize::from(currency.exponent) {
            return Err(AmountError::TooPrecise {
                amount: text.to_owned(),
                digits: currency.exponent,
                currency: currency.code,
            });
        }
        let too_large = || AmountError::Unrepresentable(text.to_owned());
        let whole_units = parse_digits(whole).ok_or_else(too_large)?;
        let padding = 10_i64.pow(u32::from(currency.exponent) - fraction.len() as u32);
        let fraction_units = parse_digits(fraction).ok_or_else(too_large)? * padding;
        let minor = whole_units
            .checked_mul(currency.scale())
            .and_then(|m| m.checked_add(fraction_units))
            .ok_or_else(too_large)?;
        if minor == 0 {
            return Err(AmountError::NotPositive(text.to_owned()));
        }
        Ok(Money { minor, currency })
    }

    /// Builds an amount from minor units, as read back from storage.
    pub fn from_minor(minor: i64, currency: Currency) -> Result<Money, AmountError> {
        if minor <= 0 {
            return Err(AmountError::NotPositive(minor.to_string()));
        }
        Ok(Money { minor, currency })
    }

    /// Refuses amounts above `max` whole units of the currency.
    pub fn at_most(self, max: u64) -> Result<Money, AmountError> {
        let limit = i64::try_from(max)
            .ok()
            .and_then(|m| m.checked_mul(self.currency.scale()));
        match limit {
            Some(limit) if self.minor > limit => Err(AmountError::TooLarge {
                amount: self.decimal(),
                max,
                currency: self.currency.code,
            }),
            _ => Ok(self),
        }
    }

    pub fn minor(&self) -> i64 {
        self.minor
    }

    pub fn currency(&self) -> Currency {
        self.currency
    }

    /// The amount as a decimal string with exactly the currency's minor digits: `42.50`.
    /// Written from the digits of the minor units (always positive), not through `format!`:
    /// every checkout writes a few.
    pub fn decimal(&self) -> String {
        let mut buffer = itoa::Buffer::new();
        let digits = buffer.format(self.minor);
        let exponent = usize::from(self.currency.exponent);
        let mut text = String::with_capacity(digits.len() + exponent + 2);
        if digits.len() <= exponent {
            // Less than one whole unit: `0.05`.
            text.push_str("0.");
            text.extend(std::iter::repeat_n('0', exponent - digits.len()));
            text.push_str(digits);
        } else {
            let (whole, fraction) = digits.split_at(digits.len() - exponent);
            text.push_str(whole);
            if exponent > 0 {
                text.push('.');
                text.push_str(fraction);
            }
        }
        text
    }
}

/// `minor` units of `currency` as [`Money::decimal`] writes them, zero included: what is
/// left of a budget, which may be nothing.
pub fn decimal_minor(minor: i64, currency: Currency) -> String {
    Money {
        minor: minor.max(0),
        currency,
    }
    .decimal()
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.decimal(), self.currency.code)
    }
}

/// The text of a JSON string or number, exactly as written, for [`Money::parse`]: a JSON
/// number is read from its digits, never through a float. `None` for other JSON values.
pub fn json_decimal(raw: &serde_json::value::RawValue) -> Option<String> {
    let text = raw.get();
    if text.starts_with('"') {
        serde_json::from_str::<String>(text).ok()
    } else if text.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
        Some(text.to_owned())
    } else {
        None
    }
}

/// The amounts [`Money::parse`] takes in a currency of `digits` minor digits and
/// [`Money::at_most`] lets through under `max`, as one regular expression (for the API
/// document): a plain decimal above zero, leading zeros allowed.
pub fn amount_pattern(max: u64, digits: u8) -> String {
    let max = max.to_string();
    let e = usize::from(digits);
    // Whole parts from 1 to max - 1, without leading zeros: the shorter numbers, then
    // each of max's digits lowered with every digit after it free.
    let mut below = Vec::new();
    if max.len() > 1 {
        below.push(format!("[1-9][0-9]{{0,{}}}", max.len() - 2));
    }
    for (i, digit) in max.bytes().enumerate() {
        let low = if i == 0 { b'1' } else { b'0' };
        if digit <= low {
            continue;
        }
        let range = match digit - 1 {
            top if top == low => char::from(low).to_string(),
            top => format!("[{}-{}]", char::from(low), char::from(top)),
        };
        let free = match max.len() - i - 1 {
            0 => String::new(),
            n => format!("[0-9]{{{n}}}"),
        };
        below.push(format!("{}{range}{free}", &max[..i]));
    }
    let mut branches = Vec::new();
    let fraction = if e > 0 {
        format!("(\\.[0-9]{{1,{e}}})?")
    } else {
        String::new()
    };
    if !below.is_empty() {
        branches.push(format!("0*({}){fraction}", below.join("|")));
    }
    let zeros = if e > 0 {
        format!("(\\.0{{1,{e}}})?")
    } else {
        String::new()
    };
    branches.push(format!("0*{max}{zeros}"));
    if e > 0 {
        // Less than one: some digit of the fraction is not zero.
        let nonzero: Vec<String> = (0..e)
            .map(|i| {
                let lead = "0".repeat(i);
                match e - 1 - i {
                    0 => format!("{lead}[1-9]"),
                    n => format!("{lead}[1-9][0-9]{{0,{n}}}"),
                }
            })
            .collect();
        branches.push(format!("0+\\.({})", nonzero.join("|")));
    }
    format!("^({})$", branches.join("|"))
}

/// `digits` or `digits.digits`, ASCII only.
fn is_decimal(text: &str) -> bool {
    let (whole, fraction) = match text.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (text, None),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    all_digits(whole) && fraction.is_none_or(all_digits)
}

fn parse_digits(digits: &str) -> Option<i64> {
    let significant = digits.trim_start_matches('0');
    if significant.len() > 18 {
        return None;
    }
    if significant.is_empty() {
        return Some(0);
    }
    significant.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usd(text: &str) -> Result<Money, AmountError> {
        Money::parse(text, Currency::USD)
    }

    #[test]
    fn amounts_that_floats_get_wrong_are_exact() {
        assert_eq!(usd("0.29").unwrap().minor(), 29);
        assert_eq!(usd("1.15").unwrap().minor(), 115);
        assert_eq!(usd("19.99").unwrap().minor(), 1999);
        assert_eq!(usd("42.5").unwrap().minor(), 4250);
        assert_eq!(usd("7").unwrap().minor(), 700);
        assert_eq!(usd("007.10").unwrap().minor(), 710);
    }

    #[test]
    fn decimal_renders_every_minor_digit() {
        assert_eq!(usd("42.5").unwrap().decimal(), "42.50");
        assert_eq!(usd("0.05").unwrap().decimal(), "0.05");
        assert_eq!(usd("0.5").unwrap().decimal(), "0.50");
        assert_eq!(usd("1000000").unwrap().decimal(), "1000000.00");
        let jpy = Currency::parse("jpy").unwrap();
        assert_eq!(Money::parse("1500", jpy).unwrap().decimal(), "1500");
        let kwd = Currency::parse("KWD").unwrap();
        assert_eq!(Money::parse("1.5", kwd).unwrap().decimal(), "1.500");
    }

    #[test]
    fn malformed_amounts_are_refused() {
        for text in [
            "", "abc", "1,00", "1e3", "+5", ".5", "5.", "4 2", "0x10", "NaN", "--1",
        ] {
            assert!(usd(text).is_err(), "{text:?} was accepted");
        }
        assert_eq!(usd("-1"), Err(AmountError::NotPositive("-1".into())));
        assert_eq!(usd("0.00"), Err(AmountError::NotPositive("0.00".into())));
        assert!(matches!(
            usd("1.234"),
            Err(AmountError::TooPrecise { digits: 2, .. })
        ));
        let jpy = Currency::parse("JPY").unwrap();
        assert!(matches!(
            Money::parse("1.5", jpy),
            Err(AmountError::TooPrecise { .. })
        ));
        assert!(matches!(
            usd("99999999999999999999"),
            Err(AmountError::Unrepresentable(_))
        ));
    }

    #[test]
    fn the_maximum_is_inclusive() {
        assert!(usd("1000.00").unwrap().at_most(1000).is_ok());
        assert!(matches!(
            usd("1000.01").unwrap().at_most(1000),
            Err(AmountError::TooLarge { max: 1000, .. })
        ));
    }

    /// The pattern takes exactly what the parser and the maximum take, every string of
    /// up to seven of `0 1 2 9 .` against a few maximums, in currencies of 0, 2 and 3
    /// minor digits.
    #[test]
    fn the_amount_pattern_says_what_parse_and_the_maximum_take() {
        let mut texts = vec![String::new()];
        let mut all = Vec::new();
        for _ in 0..7 {
            texts = texts
                .iter()
                .flat_map(|t| "0129.".chars().map(move |c| format!("{t}{c}")))
                .collect();
            all.extend(texts.iter().cloned());
        }
        all.extend(
            [
                "1000000",
                "1000000.000",
                "1000000.001",
                "0999999.999",
                "1000001",
            ]
            .map(String::from),
        );
        for code in ["JPY", "USD", "KWD"] {
            let currency = Currency::parse(code).unwrap();
            for max in [1, 2, 9, 10, 20, 120, 1000, 1_000_000] {
                let pattern = amount_pattern(max, currency.exponent());
                let regex = regex::Regex::new(&pattern).unwrap();
                for text in &all {
                    let taken = Money::parse(text, currency).and_then(|m| m.at_most(max));
                    assert_eq!(
                        regex.is_match(text),
                        taken.is_ok(),
                        "{text:?} in {code} under {max}: {pattern} vs {taken:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn unknown_currencies_are_named() {
        let err = Currency::parse("XYZ").unwrap_err();
        assert!(err.to_string().starts_with("unknown currency \"XYZ\""));
    }
}
