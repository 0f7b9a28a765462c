//! The customer's address, as the request names it: the only way in is [`Recipient::parse`].

use std::fmt;
use std::str::FromStr;

use lettre::Address;

/// The most an address may have (RFC 5321's path limit less its angle brackets).
pub const MAX_LEN: usize = 254;

/// The most an address may have before its `@` (RFC 5321's local-part limit).
pub const LOCAL_MAX_LEN: usize = 64;

/// What an address may be, as the API document says it: dot-separated atoms of letters,
/// digits and `_ % + -` before the `@`, a host name after it. Narrower than RFC 5322 on
/// purpose: no quoted local parts, no comments, no IP literals. It does not say
/// [`LOCAL_MAX_LEN`], which a pattern of this shape can only say with a lookahead.
pub const PATTERN: &str = "^[A-Za-z0-9_%+-]+(\\.[A-Za-z0-9_%+-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$";

/// One email address (`local@domain`), checked: no display name, no list, no spaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipient(Address);

impl Recipient {
    pub fn parse(text: &str) -> Result<Recipient, String> {
        if text.is_empty() {
            return Err("must not be empty".into());
        }
        if text.chars().count() > MAX_LEN {
            return Err(format!(
                "has {} characters, more than the {MAX_LEN} an address may have",
                text.chars().count()
            ));
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("must be one address, without spaces or a display name".into());
        }
        if text.contains([',', ';', '<', '>']) {
            return Err("must be one address (local@domain), not a list or a display name".into());
        }
        if text
            .split('@')
            .next()
            .is_some_and(|local| local.len() > LOCAL_MAX_LEN)
        {
            return Err(format!(
                "has more than {LOCAL_MAX_LEN} characters before the @, the most an address may have"
            ));
        }
        if !plain(text) {
            return Err(format!(
                "{text:?} is not an address of the form local@domain (letters, digits, . _ % + - before the @, a host name after it)"
            ));
        }
        Address::from_str(text)
            .map(Recipient)
            .map_err(|err| format!("{text:?} is not an address of the form local@domain ({err})"))
    }

    pub fn as_str(&self) -> &str {
        AsRef::<str>::as_ref(&self.0)
    }

    pub(crate) fn address(&self) -> &Address {
        &self.0
    }
}

/// Whether `text` matches [`PATTERN`].
fn plain(text: &str) -> bool {
    let Some((local, domain)) = text.split_once('@') else {
        return false;
    };
    let atom = |a: &str| {
        !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '%' | '+' | '-'))
    };
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    local.split('.').all(atom) && domain.split('.').all(label)
}

impl fmt::Display for Recipient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_plain_address_is_taken_and_anything_else_is_refused() {
        assert_eq!(
            Recipient::parse("ann@example.com").unwrap().as_str(),
            "ann@example.com"
        );
        for good in [
            "ann.b+shop@mail.example.co",
            "a@b",
            "x_1%2-3@host-1.example",
        ] {
            assert_eq!(
                Recipient::parse(good).map(|r| r.to_string()),
                Ok(good.to_owned())
            );
        }
        for bad in [
            "",
            "ann",
            "ann@",
            "@example.com",
            "ann @example.com",
            "Ann <ann@example.com>",
            "ann@example.com,bob@example.com",
            "ann@example.com\r\nBcc: eve@example.com",
            "\"ann b\"@example.com",
            "ann..b@example.com",
            "ann@-example.com",
            "ann@[127.0.0.1]",
        ] {
            assert!(Recipient::parse(bad).is_err(), "{bad:?} was taken");
        }
        assert!(
            Recipient::parse(&format!("{}@example.com", "a".repeat(65)))
                .unwrap_err()
                .contains("64")
        );
        let long = format!("{}@example.com", "a".repeat(250));
        assert!(Recipient::parse(&long).unwrap_err().contains("254"));
    }
}
