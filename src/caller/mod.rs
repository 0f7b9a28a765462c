//! Who is calling: the [`Caller`] a request's API key names, and its [`Scopes`].
//!
//! A key is `ck_` and 64 hex digits: 32 random bytes from the operating system. The
//! database keeps only its SHA-256 (see [`KeyHash`]), so a copy of the database lets no
//! one call the service. Keys live in the database, not in one process, and every request
//! is checked against it: a key created or revoked by `checkout api-keys` on any machine
//! counts from the next request on every instance. Making and revoking keys is
//! [`api_keys`]; the check that turns a request's `Authorization: Bearer …` into a
//! [`Caller`] is [`Gate`].

pub mod api_keys;
mod gate;

/// `CHECKOUT_AUTH` is a setting; re-exported here, where the gate reads it.
pub use crate::config::AuthMode;
pub use api_keys::{
    KEY_PREFIX, KeyError, KeyHash, KeySpec, NewKey, create, create_with, generate_key, keys_exist,
    list, named, revoke, valid_name,
};
pub use gate::{AuthRefusal, Gate, KEYS_REFRESH, KeyWatch, Verdict};

use std::fmt;

use crate::config::PaymentSettings;
use crate::payments::{Currency, Money, PerCurrency};

/// Who is calling, and what it may do. The API key check inserts one into every request's
/// extensions on the callers' routes: the key's caller, or [`Caller::open`] while the
/// service needs no key. Idempotency-Keys are scoped to its name: two callers may use the
/// same key without meeting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The key's name; `""` for the anonymous caller of open mode.
    pub name: String,
    pub scopes: Scopes,
    /// The key's own approval thresholds (`--approval-above`); where it names no amount
    /// for a currency, `CHECKOUT_APPROVAL_ABOVE` decides.
    pub approval_above: Option<PerCurrency>,
    /// The key's own daily budget (`--budget-per-day`); where it names no amount for a
    /// currency, `CHECKOUT_BUDGET_PER_DAY` decides.
    pub budget_per_day: Option<PerCurrency>,
}

impl Caller {
    /// The anonymous caller `""` of open mode (no key needed): every scope, no limits of
    /// its own (the settings' still apply).
    pub fn open() -> Caller {
        Caller {
            name: String::new(),
            scopes: Scopes::ALL,
            approval_above: None,
            budget_per_day: None,
        }
    }

    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.has(scope)
    }

    /// Whether an operation of `amount` by this caller waits for a person: above the key's
    /// own threshold for its currency, else above `setting` (`CHECKOUT_APPROVAL_ABOVE`).
    pub fn needs_approval(&self, setting: &PerCurrency, amount: Money) -> bool {
        own_or_setting(self.approval_above.as_ref(), setting, amount.currency())
            .is_some_and(|above| amount.minor() > above.minor())
    }

    /// What this caller may be charged in `currency` per UTC day: the key's own, else the
    /// setting's; `None`: no budget.
    pub fn budget_per_day(&self, settings: &PaymentSettings, currency: Currency) -> Option<Money> {
        own_or_setting(
            self.budget_per_day.as_ref(),
            &settings.budget_per_day,
            currency,
        )
    }
}

fn own_or_setting(
    own: Option<&PerCurrency>,
    setting: &PerCurrency,
    currency: Currency,
) -> Option<Money> {
    own.and_then(|own| own.get(currency))
        .or_else(|| setting.get(currency))
}

/// What an API key lets its caller do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// POST /checkout, and its own operations and receipts.
    Checkout,
    /// POST /refunds.
    Refund,
    /// The approvals endpoints: approve and deny.
    Approve,
    /// Every caller's receipts and operations.
    Read,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Checkout, Scope::Refund, Scope::Approve, Scope::Read];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Checkout => "checkout",
            Scope::Refund => "refund",
            Scope::Approve => "approve",
            Scope::Read => "read",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of scopes, written as a comma list (`checkout,read`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    pub const ALL: Scopes = Scopes(0b1111);
    /// What a new key gets unless told otherwise.
    pub const DEFAULT: Scopes = Scopes(1 << Scope::Checkout as u8);

    pub fn of(scopes: &[Scope]) -> Scopes {
        Scopes(scopes.iter().fold(0, |bits, s| bits | s.bit()))
    }

    pub fn has(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// Reads `checkout,refund`: at least one scope, each one of checkout, refund, approve,
    /// read.
    pub fn parse(text: &str) -> Result<Scopes, String> {
        let mut bits = 0;
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let scope = Scope::ALL
                .into_iter()
                .find(|s| s.as_str() == word)
                .ok_or_else(|| {
                    format!(
                        "{word:?} is not a scope: the scopes are checkout, refund, approve, read"
                    )
                })?;
            bits |= scope.bit();
        }
        if bits == 0 {
            return Err("name at least one scope: checkout, refund, approve, read".into());
        }
        Ok(Scopes(bits))
    }
}

impl fmt::Display for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for scope in Scope::ALL.into_iter().filter(|s| self.has(*s)) {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            f.write_str(scope.as_str())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_read_what_they_write_and_refuse_the_rest() {
        let scopes = Scopes::parse("read, checkout").unwrap();
        assert_eq!(scopes.to_string(), "checkout,read");
        assert!(scopes.has(Scope::Read) && !scopes.has(Scope::Approve));
        assert_eq!(Scopes::ALL.to_string(), "checkout,refund,approve,read");
        assert_eq!(Scopes::DEFAULT.to_string(), "checkout");
        assert!(Scopes::parse("").is_err());
        assert!(Scopes::parse("checkout,admin").is_err());
    }

    #[test]
    fn a_key_s_own_limit_comes_before_the_setting() {
        let usd = Currency::parse("USD").unwrap();
        let eur = Currency::parse("EUR").unwrap();
        let mut settings = crate::config::Settings::default().payments;
        settings.budget_per_day = PerCurrency::parse("USD:100.00,EUR:90.00").unwrap();
        let mut caller = Caller::open();
        assert_eq!(
            caller.budget_per_day(&settings, usd).unwrap().minor(),
            10_000
        );
        caller.budget_per_day = Some(PerCurrency::parse("USD:5.00").unwrap());
        assert_eq!(caller.budget_per_day(&settings, usd).unwrap().minor(), 500);
        assert_eq!(
            caller.budget_per_day(&settings, eur).unwrap().minor(),
            9_000
        );
        assert!(!caller.needs_approval(
            &settings.approval_above,
            Money::from_minor(1 << 40, usd).unwrap()
        ));
        settings.approval_above = PerCurrency::parse("USD:10.00").unwrap();
        let dollars = |minor| Money::from_minor(minor, usd).unwrap();
        assert!(!caller.needs_approval(&settings.approval_above, dollars(1_000)));
        assert!(caller.needs_approval(&settings.approval_above, dollars(1_001)));
        caller.approval_above = Some(PerCurrency::parse("USD:20.00").unwrap());
        assert!(!caller.needs_approval(&settings.approval_above, dollars(1_001)));
        assert!(!caller.needs_approval(
            &settings.approval_above,
            Money::from_minor(1_001, eur).unwrap()
        ));
        assert!(Caller::open().has(Scope::Approve));
    }
}
