//! [`Effect`]: what an operation does to money. One type for every place that tells a
//! charge from a refund (the loop's prompt and tools, an approval, the recorded request,
//! the counters), so a third kind is one variant the compiler walks through, not a string.

use std::fmt;

/// What an operation does to its order's money.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effect {
    /// `POST /checkout`: charge the order, once (keyed by the order id).
    Charge,
    /// `POST /refunds`: give back part or all of its charge, once (keyed by the operation).
    Refund,
}

impl Effect {
    /// Every effect, for what looks one up by another of its names.
    pub const ALL: [Effect; 2] = [Effect::Charge, Effect::Refund];

    /// The name the database and the API use: `charge`, `refund`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Effect::Charge => "charge",
            Effect::Refund => "refund",
        }
    }

    pub fn parse(text: &str) -> Option<Effect> {
        match text {
            "charge" => Some(Effect::Charge),
            "refund" => Some(Effect::Refund),
            _ => None,
        }
    }

    /// What it did, done: `charged`, `refunded`.
    pub const fn done(self) -> &'static str {
        match self {
            Effect::Charge => "charged",
            Effect::Refund => "refunded",
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_effect_reads_back_as_written() {
        for effect in [Effect::Charge, Effect::Refund] {
            assert_eq!(Effect::parse(effect.as_str()), Some(effect));
        }
        assert_eq!(Effect::parse("capture"), None);
    }
}
