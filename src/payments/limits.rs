//! Amounts set per currency: the approval threshold and the daily budget, as the
//! settings (`USD:100.00,EUR:90.00`) and an API key's own (`--approval-above USD:50.00`)
//! give them.

use std::fmt;

use super::money::{Currency, Money};

/// At most one amount per currency. A currency not named has no limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PerCurrency(Vec<Money>);

impl PerCurrency {
    /// Reads `CUR:AMOUNT[,CUR:AMOUNT…]`; an empty text is no limit at all.
    pub fn parse(text: &str) -> Result<PerCurrency, String> {
        let mut amounts: Vec<Money> = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (code, amount) = item
                .split_once(':')
                .ok_or_else(|| format!("{item:?} is not CURRENCY:AMOUNT, such as USD:100.00"))?;
            let currency = Currency::parse(code.trim()).map_err(|err| err.to_string())?;
            let money = Money::parse(amount.trim(), currency)
                .map_err(|err| format!("{item:?}: the amount {err}"))?;
            if amounts.iter().any(|m| m.currency() == currency) {
                return Err(format!("{currency} is named twice"));
            }
            amounts.push(money);
        }
        Ok(PerCurrency(amounts))
    }

    /// The amount set for `currency`, if any.
    pub fn get(&self, currency: Currency) -> Option<Money> {
        self.0.iter().find(|m| m.currency() == currency).copied()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// As it is written in a setting: `USD:100.00,EUR:90.00`.
impl fmt::Display for PerCurrency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, money) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:{}", money.currency(), money.decimal())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_currency_reads_what_it_writes_and_refuses_the_rest() {
        let limits = PerCurrency::parse("USD:100.00, EUR:90").unwrap();
        assert_eq!(limits.to_string(), "USD:100.00,EUR:90.00");
        let usd = Currency::parse("USD").unwrap();
        assert_eq!(limits.get(usd).unwrap().minor(), 10_000);
        assert!(limits.get(Currency::parse("JPY").unwrap()).is_none());
        assert!(PerCurrency::parse("").unwrap().is_empty());
        assert!(PerCurrency::parse("USD").is_err());
        assert!(PerCurrency::parse("USD:1,USD:2").is_err());
        assert!(PerCurrency::parse("USD:0").is_err());
        assert!(PerCurrency::parse("XXX:1").is_err());
    }
}
