//! What a model writes into a charge call, read leniently in form and strictly in value.
//!
//! Real models write what the prompt suggests: `"42.50 USD"`, `"$42.50"`, `42.5`, `"42.5"`,
//! `order_id` for `orderId`. Each form is read; its *value* must then be exactly the
//! authorized one (decimal, never a float), a currency it names must be the authorized
//! currency, and the order id must be the order's, character for character.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::payments::money::json_decimal;
use crate::payments::{Currency, Money, Order};

/// The arguments of a `charge` call as the model wrote them.
#[derive(Debug, Deserialize)]
pub struct ChargeArguments {
    #[serde(rename = "orderId", alias = "order_id", alias = "orderid")]
    order_id: Box<RawValue>,
    /// Kept as written: a JSON number is read from its text, never through a float.
    amount: Box<RawValue>,
    /// Some models add the currency as a field of its own; when they do, it must match.
    #[serde(default)]
    currency: Option<String>,
}

/// The longest arguments of a charge call that are read (a real one is some 60 bytes):
/// longer ones are refused unread, and nothing of them is echoed to the model.
pub const MAX_ARGUMENT_BYTES: usize = 1024;

/// Why a charge call was refused: what the model is told, so that it can correct itself.
#[derive(Debug, PartialEq, Eq)]
pub enum ArgumentRefusal {
    /// The arguments are not a JSON object with `orderId` and `amount`.
    Shape(String),
    /// Another order than the one being checked out.
    OtherOrder(String),
    /// An amount that cannot be read as a decimal.
    Unreadable(String),
    /// A currency that is not the authorized one.
    OtherCurrency(String),
    /// A readable amount that is not the authorized amount.
    OtherAmount(String),
}

impl ArgumentRefusal {
    /// One sentence for the model: what was wrong.
    pub fn reason(&self, order: &Order) -> String {
        let amount = order.amount();
        match self {
            ArgumentRefusal::Shape(err) => {
                format!("the arguments must be a JSON object with orderId and amount: {err}")
            }
            ArgumentRefusal::OtherOrder(written) => format!(
                "orderId {written} is not the order being checked out; the order id is {:?}, written exactly as given",
                order.id().as_str()
            ),
            ArgumentRefusal::Unreadable(written) => format!(
                "amount {written} is not a decimal amount such as {:?}",
                amount.decimal()
            ),
            ArgumentRefusal::OtherCurrency(named) => format!(
                "the checkout is in {}, but the call names {named}",
                amount.currency()
            ),
            ArgumentRefusal::OtherAmount(read) => {
                format!("the authorized amount is {amount}, not {read}")
            }
        }
    }
}

impl ChargeArguments {
    /// Parses the call's JSON text, if it is no longer than [`MAX_ARGUMENT_BYTES`].
    pub fn parse(text: &str) -> Result<ChargeArguments, ArgumentRefusal> {
        if text.len() > MAX_ARGUMENT_BYTES {
            return Err(ArgumentRefusal::Shape(format!(
                "they are {} bytes; a charge's arguments take at most {MAX_ARGUMENT_BYTES}",
                text.len()
            )));
        }
        serde_json::from_str(text).map_err(|err| ArgumentRefusal::Shape(err.to_string()))
    }

    /// Checks the call against the authorized order: `Ok` only when it asks for exactly
    /// that order, amount and currency.
    pub fn check(&self, order: &Order) -> Result<(), ArgumentRefusal> {
        let written_id = self.order_id.get();
        let id = serde_json::from_str::<String>(written_id)
            .ok()
            .or_else(|| is_json_integer(written_id).then(|| written_id.to_owned()));
        if id.as_deref() != Some(order.id().as_str()) {
            return Err(ArgumentRefusal::OtherOrder(written_id.to_owned()));
        }
        let authorized = order.amount();
        if let Some(code) = &self.currency
            && !names(code.trim(), authorized.currency())
        {
            return Err(ArgumentRefusal::OtherCurrency(format!("{code:?}")));
        }
        let asked = amount(&self.amount, authorized.currency())?;
        if asked != authorized {
            return Err(ArgumentRefusal::OtherAmount(asked.to_string()));
        }
        Ok(())
    }
}

fn is_json_integer(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Reads an amount written as a JSON number or string, in `currency`.
///
/// A string may carry currency codes or symbols before or after the number (`"42.50 USD"`,
/// `"$42.50"`, `"EUR 7"`), thousands separators in their usual places (`"1,500.00"`), and
/// trailing zeros past the currency's minor digits (`"42.500"`). Every code or symbol it
/// names must stand for `currency`.
pub fn amount(raw: &RawValue, currency: Currency) -> Result<Money, ArgumentRefusal> {
    let written = raw.get();
    let unreadable = || ArgumentRefusal::Unreadable(written.to_owned());
    let text = json_decimal(raw).ok_or_else(unreadable)?;
    let text = text.trim();
    let (Some(first), Some(last)) = (
        text.find(|c: char| c.is_ascii_digit()),
        text.rfind(|c: char| c.is_ascii_digit()),
    ) else {
        return Err(unreadable());
    };
    let (before, number, after) = (&text[..first], &text[first..=last], &text[last + 1..]);
    let before = before.trim_end();
    // A sign or a bare point before the digits: "-5", "$-5", ".5".
    if before.ends_with(['-', '−', '.', '+']) {
        return Err(unreadable());
    }
    for marker in before.split_whitespace().chain(after.split_whitespace()) {
        match marker_currency(marker, currency) {
            Marker::Authorized => {}
            Marker::Other => return Err(ArgumentRefusal::OtherCurrency(format!("{marker:?}"))),
            Marker::NotACurrency => return Err(unreadable()),
        }
    }
    let plain = without_grouping(number).ok_or_else(unreadable)?;
    let plain = without_extra_zeros(&plain, currency);
    Money::parse(plain, currency).map_err(|_| unreadable())
}

enum Marker {
    Authorized,
    Other,
    NotACurrency,
}

/// Symbols and the currencies they may stand for (a `$` is USD, or CAD in a CAD checkout).
const SYMBOLS: &[(&str, &[&str])] = &[
    ("$", &["USD", "AUD", "CAD", "NZD", "HKD", "SGD", "MXN"]),
    ("US$", &["USD"]),
    ("A$", &["AUD"]),
    ("C$", &["CAD"]),
    ("NZ$", &["NZD"]),
    ("HK$", &["HKD"]),
    ("S$", &["SGD"]),
    ("R$", &["BRL"]),
    ("€", &["EUR"]),
    ("£", &["GBP"]),
    ("¥", &["JPY", "CNY"]),
    ("￥", &["JPY", "CNY"]),
    ("円", &["JPY"]),
    ("₹", &["INR"]),
    ("₩", &["KRW"]),
    ("zł", &["PLN"]),
    ("Kč", &["CZK"]),
    ("kr", &["SEK", "NOK", "DKK"]),
    ("Fr.", &["CHF"]),
    ("R", &["ZAR"]),
];

fn names(marker: &str, currency: Currency) -> bool {
    matches!(marker_currency(marker, currency), Marker::Authorized)
}

/// What a word beside the number says about the currency. A word may join a symbol and
/// a code (`US$`, `$USD`).
fn marker_currency(marker: &str, currency: Currency) -> Marker {
    if marker.len() == 3 && marker.chars().all(|c| c.is_ascii_alphabetic()) {
        return match Currency::parse(marker) {
            Ok(named) if named == currency => Marker::Authorized,
            Ok(_) => Marker::Other,
            // Three letters that are no currency we know: another currency all the same.
            Err(_) => Marker::Other,
        };
    }
    if let Some((_, codes)) = SYMBOLS.iter().find(|(symbol, _)| *symbol == marker) {
        return if codes.contains(&currency.code()) {
            Marker::Authorized
        } else {
            Marker::Other
        };
    }
    // A symbol written against a code: "$USD", "USD$".
    for (symbol, _) in SYMBOLS {
        let rest = marker
            .strip_prefix(symbol)
            .or_else(|| marker.strip_suffix(symbol));
        if let Some(code) = rest.filter(|r| r.len() == 3) {
            return match (
                marker_currency(symbol, currency),
                marker_currency(code, currency),
            ) {
                (Marker::Authorized, Marker::Authorized) => Marker::Authorized,
                (Marker::NotACurrency, _) | (_, Marker::NotACurrency) => Marker::NotACurrency,
                _ => Marker::Other,
            };
        }
    }
    Marker::NotACurrency
}

/// `1,500.00` → `1500.00`; `1,50` and `15,00` are refused: a comma is read only as a
/// thousands separator in its usual places, never as a decimal point.
fn without_grouping(number: &str) -> Option<String> {
    if !number.contains(',') {
        return Some(number.to_owned());
    }
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (number, None),
    };
    let mut groups = whole.split(',');
    let head = groups.next()?;
    let head_ok = (1..=3).contains(&head.len()) && head.bytes().all(|b| b.is_ascii_digit());
    let rest_ok = groups.all(|g| g.len() == 3 && g.bytes().all(|b| b.is_ascii_digit()));
    if !(head_ok && rest_ok) {
        return None;
    }
    let mut plain: String = whole.chars().filter(|c| *c != ',').collect();
    if let Some(fraction) = fraction {
        plain.push('.');
        plain.push_str(fraction);
    }
    Some(plain)
}

/// Drops zeros past the currency's minor digits, which change nothing: `42.500` USD is
/// `42.50`, `1500.00` JPY is `1500`. Any other digit there is left for the parser to refuse.
fn without_extra_zeros(number: &str, currency: Currency) -> &str {
    let Some(point) = number.find('.') else {
        return number;
    };
    let keep = point + 1 + usize::from(currency.exponent());
    if number.len() <= keep || !number[keep..].bytes().all(|b| b == b'0') {
        return number;
    }
    let trimmed = &number[..keep];
    trimmed.strip_suffix('.').unwrap_or(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payments::{Order, OrderId};

    #[allow(
        clippy::disallowed_methods,
        reason = "a test's fixed order, not a request's"
    )]
    fn order(id: &str, amount: &str, currency: &str) -> Order {
        let currency = Currency::parse(currency).unwrap();
        Order::new(
            OrderId::parse(id).unwrap(),
            Money::parse(amount, currency).unwrap(),
        )
    }

    fn check(args: &str, order: &Order) -> Result<(), ArgumentRefusal> {
        ChargeArguments::parse(args)?.check(order)
    }

    #[test]
    fn amounts_in_every_accepted_form_are_the_authorized_value() {
        let o = order("A-100", "42.50", "USD");
        for amount in [
            r#""42.50""#,
            r#""42.5""#,
            r#""42.500""#,
            "42.5",
            "42.50",
            "42.500",
            r#""42.50 USD""#,
            r#""42.50 usd""#,
            r#""USD 42.50""#,
            r#""USD42.50""#,
            r#""42.50USD""#,
            r#""$42.50""#,
            r#""42.50$""#,
            r#""$ 42.50""#,
            r#""US$42.50""#,
            r#""$42.50 USD""#,
            r#"" 42.50 ""#,
        ] {
            let args = format!(r#"{{"orderId": "A-100", "amount": {amount}}}"#);
            assert_eq!(check(&args, &o), Ok(()), "{amount} was refused");
        }
    }

    #[test]
    fn other_currencies_read_their_own_symbols_and_digits() {
        let eur = order("E-1", "1500.00", "EUR");
        for amount in [r#""€1500""#, r#""1,500.00 EUR""#, r#""1500 €""#, "1500"] {
            let args = format!(r#"{{"orderId": "E-1", "amount": {amount}}}"#);
            assert_eq!(check(&args, &eur), Ok(()), "{amount} was refused");
        }
        let jpy = order("J-1", "1500", "JPY");
        for amount in [
            r#""¥1500""#,
            r#""1500 JPY""#,
            r#""1,500""#,
            "1500",
            "1500.0",
            r#""1500.00""#,
        ] {
            let args = format!(r#"{{"orderId": "J-1", "amount": {amount}}}"#);
            assert_eq!(check(&args, &jpy), Ok(()), "{amount} was refused");
        }
        let cad = order("C-1", "5", "CAD");
        assert_eq!(check(r#"{"orderId":"C-1","amount":"$5"}"#, &cad), Ok(()));
        assert_eq!(
            check(r#"{"orderId":"C-1","amount":"C$5.00"}"#, &cad),
            Ok(())
        );
    }

    #[test]
    fn values_compare_exactly_never_through_a_float() {
        let o = order("F-1", "0.29", "USD");
        assert_eq!(check(r#"{"orderId":"F-1","amount":0.29}"#, &o), Ok(()));
        assert_eq!(
            check(r#"{"orderId":"F-1","amount":0.2900000000000000001}"#, &o),
            Err(ArgumentRefusal::Unreadable("0.2900000000000000001".into())),
            "a float would round this to 0.29"
        );
        assert_eq!(
            check(r#"{"orderId":"F-1","amount":"0.3"}"#, &o),
            Err(ArgumentRefusal::OtherAmount("0.30 USD".into()))
        );
        assert_eq!(
            check(r#"{"orderId":"F-1","amount":"0.291"}"#, &o),
            Err(ArgumentRefusal::Unreadable(r#""0.291""#.into()))
        );
        let big = order("F-2", "99999.99", "USD");
        assert_eq!(
            check(r#"{"orderId":"F-2","amount":99999.99}"#, &big),
            Ok(())
        );
        assert_eq!(
            check(r#"{"orderId":"F-2","amount":100000}"#, &big),
            Err(ArgumentRefusal::OtherAmount("100000.00 USD".into()))
        );
    }

    #[test]
    fn another_currency_is_refused_by_name() {
        let o = order("A-100", "42.50", "USD");
        for (amount, named) in [
            (r#""42.50 EUR""#, r#""EUR""#),
            (r#""€42.50""#, r#""€""#),
            (r#""42.50 XYZ""#, r#""XYZ""#),
            (r#""¥42.50""#, r#""¥""#),
            (r#""R$42.50""#, r#""R$""#),
        ] {
            let args = format!(r#"{{"orderId": "A-100", "amount": {amount}}}"#);
            assert_eq!(
                check(&args, &o),
                Err(ArgumentRefusal::OtherCurrency(named.into())),
                "{amount}"
            );
        }
        assert_eq!(
            check(
                r#"{"orderId":"A-100","amount":"42.50","currency":"EUR"}"#,
                &o
            ),
            Err(ArgumentRefusal::OtherCurrency(r#""EUR""#.into()))
        );
        assert_eq!(
            check(
                r#"{"orderId":"A-100","amount":"42.50","currency":"usd"}"#,
                &o
            ),
            Ok(())
        );
    }

    #[test]
    fn amounts_that_are_not_plain_decimals_are_refused() {
        let o = order("A-100", "42.50", "USD");
        for amount in [
            r#""""#,
            r#""forty-two""#,
            r#""-42.50""#,
            "-42.5",
            r#""$-42.50""#,
            r#""+42.50""#,
            r#""42,50""#,
            r#""4,25.0""#,
            r#""42.50 dollars""#,
            r#""4e1""#,
            "4.25e1",
            r#""42 .50""#,
            r#""0x2A""#,
            "null",
            "true",
            r#"{"value": "42.50"}"#,
            r#"["42.50"]"#,
            r#"".5""#,
        ] {
            let args = format!(r#"{{"orderId": "A-100", "amount": {amount}}}"#);
            assert!(
                matches!(check(&args, &o), Err(ArgumentRefusal::Unreadable(_))),
                "{amount} was not refused as unreadable: {:?}",
                check(&args, &o)
            );
        }
    }

    #[test]
    fn order_ids_compare_exactly_in_either_field_name() {
        let o = order("X.1:2", "42.50", "USD");
        assert_eq!(check(r#"{"orderId":"X.1:2","amount":"42.50"}"#, &o), Ok(()));
        assert_eq!(
            check(r#"{"order_id":"X.1:2","amount":"42.50"}"#, &o),
            Ok(())
        );
        for id in [
            r#""X.1""#,
            r#""x.1:2""#,
            r#"" X.1:2""#,
            r#""X.1:2 ""#,
            r##""#X.1:2""##,
        ] {
            let args = format!(r#"{{"orderId": {id}, "amount": "42.50"}}"#);
            assert_eq!(
                check(&args, &o),
                Err(ArgumentRefusal::OtherOrder(id.into())),
                "{id}"
            );
        }
        let numeric = order("12345", "7", "USD");
        assert_eq!(check(r#"{"orderId":12345,"amount":7}"#, &numeric), Ok(()));
        assert_eq!(
            check(r#"{"orderId":12345.0,"amount":7}"#, &numeric),
            Err(ArgumentRefusal::OtherOrder("12345.0".into()))
        );
    }

    #[test]
    fn arguments_without_both_fields_are_refused_by_shape() {
        let o = order("A-100", "42.50", "USD");
        for args in [
            r#"{"orderId":"A-100"}"#,
            r#"{"amount":"42.50"}"#,
            r#"{"orderId":"A-100","amount":"#,
            r#""A-100 42.50""#,
            "",
        ] {
            assert!(
                matches!(check(args, &o), Err(ArgumentRefusal::Shape(_))),
                "{args:?}: {:?}",
                check(args, &o)
            );
        }
    }

    #[test]
    fn refusals_tell_the_model_what_to_write() {
        let o = order("X.1:2", "42.50", "USD");
        let err = check(r#"{"orderId":"X.1","amount":"42.50"}"#, &o).unwrap_err();
        assert_eq!(
            err.reason(&o),
            r#"orderId "X.1" is not the order being checked out; the order id is "X.1:2", written exactly as given"#
        );
        let err = check(r#"{"orderId":"X.1:2","amount":"42"}"#, &o).unwrap_err();
        assert_eq!(
            err.reason(&o),
            "the authorized amount is 42.50 USD, not 42.00 USD"
        );
        let err = check(r#"{"orderId":"X.1:2","amount":"42.50 EUR"}"#, &o).unwrap_err();
        assert_eq!(
            err.reason(&o),
            r#"the checkout is in USD, but the call names "EUR""#
        );
    }
}
