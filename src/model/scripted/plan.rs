//! The fault-plan language: which rounds misbehave, how, and how often.
//!
//! A fault plan is a comma-separated list of `FAULT[@ROUND][xTIMES][%PERCENT]`:
//! `timeout@2x3` hangs the first three requests of round 2 (round 1 is the first request
//! of a loop attempt); `503%20` answers 20 % of all requests 503. See [`Fault::parse`].

use std::fmt::Write as _;
use std::time::Duration;

/// How a round misbehaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer this HTTP status with an OpenAI-style error body.
    Status {
        status: u16,
        retry_after: Option<RetryAfter>,
        /// 429 with code `insufficient_quota`: the account is out of credit.
        quota: bool,
    },
    /// Never answer (the client's request timeout must fire).
    Timeout,
    /// Close the connection without answering.
    Close,
    /// Answer normally, this much later.
    Slow(Duration),
    /// Answer 200 with a body that is not JSON.
    Malformed,
    /// Ask to charge another order than the user named.
    WrongOrder,
    /// Ask to charge another amount than the user named.
    WrongAmount,
    /// Ask for the same charge twice in one answer.
    DoubleCharge,
    /// Ask to charge even though the order is charged; with no round, forever.
    Recharge,
    /// Answer in text without charging.
    NoCharge,
    /// Call a tool that does not exist.
    UnknownTool,
    /// Write tool arguments that are not valid JSON.
    BadArguments,
    /// Leave the amount out of the tool arguments.
    MissingField,
    /// Write the amount as a JSON number instead of a string.
    NumericAmount,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfter {
    Seconds(u64),
    /// An HTTP date this many seconds ahead.
    DateIn(u64),
}

/// A fault, where it applies and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    pub fault: Fault,
    /// The round it applies to; every round when unset.
    pub round: Option<u32>,
    /// How many requests it hits before it is spent; unlimited when unset.
    pub times: Option<u32>,
    /// The share of matching requests it hits (pseudo-random, reproducible).
    pub percent: Option<u8>,
}

impl Fault {
    /// Parses one fault: `503`, `503+retry-after=2`, `503+retry-after-date=2`, `429+quota`,
    /// `timeout`, `close`, `slow=1500`, `malformed`, `wrong-order`, `wrong-amount`,
    /// `double-charge`, `recharge` (alias `never-stop`), `no-charge`, `unknown-tool`,
    /// `bad-arguments`, `missing-field`, `numeric-amount`.
    pub fn parse(text: &str) -> Result<Fault, String> {
        let mut parts = text.split('+');
        let head = parts.next().unwrap_or_default();
        let options: Vec<&str> = parts.collect();
        if let Ok(status) = head.parse::<u16>() {
            if !(400..600).contains(&status) {
                return Err(format!("{status} is not an error status"));
            }
            let mut fault = Fault::Status {
                status,
                retry_after: None,
                quota: false,
            };
            for option in options {
                let Fault::Status {
                    retry_after, quota, ..
                } = &mut fault
                else {
                    unreachable!()
                };
                match option.split_once('=') {
                    Some(("retry-after", secs)) => {
                        *retry_after = Some(RetryAfter::Seconds(parse_number(secs, option)?))
                    }
                    Some(("retry-after-date", secs)) => {
                        *retry_after = Some(RetryAfter::DateIn(parse_number(secs, option)?))
                    }
                    None if option == "quota" => *quota = true,
                    _ => return Err(format!("unknown status option {option:?}")),
                }
            }
            return Ok(fault);
        }
        if !options.is_empty() {
            return Err(format!("{head:?} takes no options"));
        }
        Ok(match head.split_once('=') {
            Some(("slow", ms)) => Fault::Slow(Duration::from_millis(parse_number(ms, head)?)),
            Some(_) => return Err(format!("unknown fault {head:?}")),
            None => match head {
                "timeout" => Fault::Timeout,
                "close" => Fault::Close,
                "malformed" => Fault::Malformed,
                "wrong-order" => Fault::WrongOrder,
                "wrong-amount" => Fault::WrongAmount,
                "double-charge" => Fault::DoubleCharge,
                "recharge" | "never-stop" => Fault::Recharge,
                "no-charge" => Fault::NoCharge,
                "unknown-tool" => Fault::UnknownTool,
                "bad-arguments" => Fault::BadArguments,
                "missing-field" => Fault::MissingField,
                "numeric-amount" => Fault::NumericAmount,
                _ => return Err(format!("unknown fault {head:?}")),
            },
        })
    }

    /// Faults that are a failure of the HTTP exchange, answered without "thinking".
    pub(super) fn is_transport(&self) -> bool {
        matches!(self, Fault::Status { .. } | Fault::Close | Fault::Timeout)
    }
}

impl FaultRule {
    /// Parses a plan: `FAULT[@ROUND][xTIMES][%PERCENT]`, comma-separated. Empty is none.
    pub fn parse_plan(plan: &str) -> Result<Vec<FaultRule>, String> {
        plan.split(',')
            .map(str::trim)
            .filter(|rule| !rule.is_empty())
            .map(|rule| FaultRule::parse(rule).map_err(|e| format!("fault {rule:?}: {e}")))
            .collect()
    }

    fn parse(text: &str) -> Result<FaultRule, String> {
        let (rest, percent) = match text.rsplit_once('%') {
            Some((rest, p)) => {
                let p: u8 = parse_number(p, text)?;
                if p > 100 {
                    return Err("a percent is at most 100".into());
                }
                (rest, Some(p))
            }
            None => (text, None),
        };
        let (rest, times) = match rest.rsplit_once('x') {
            Some((rest, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                (rest, Some(parse_number(n, text)?))
            }
            _ => (rest, None),
        };
        let (fault, round) = match rest.split_once('@') {
            Some((fault, round)) => (fault, Some(parse_number(round, text)?)),
            None => (rest, None),
        };
        Ok(FaultRule {
            fault: Fault::parse(fault)?,
            round,
            times,
            percent,
        })
    }
}

fn parse_number<T: std::str::FromStr>(text: &str, context: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{text:?} in {context:?} is not a number"))
}

/// The fault for this request, and any extra delay: `slow` rules add to the delay and
/// let the next matching rule choose the answer, so `slow` composes with other faults.
pub(super) fn pick_fault(
    rules: &mut [(FaultRule, u32)],
    round: u32,
    number: u64,
) -> (Duration, Option<Fault>) {
    let mut extra = Duration::ZERO;
    for (index, (rule, used)) in rules.iter_mut().enumerate() {
        if rule.round.is_some_and(|r| r != round) {
            continue;
        }
        if rule.times.is_some_and(|times| *used >= times) {
            continue;
        }
        let draw = splitmix64(number ^ ((index as u64 + 1) << 48)) % 100;
        if rule
            .percent
            .is_some_and(|percent| draw >= u64::from(percent))
        {
            continue;
        }
        *used += 1;
        match &rule.fault {
            Fault::Slow(delay) => extra += *delay,
            fault => return (extra, Some(fault.clone())),
        }
    }
    (extra, None)
}

/// A reproducible stand-in for a random draw.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The plan as written, for start-up logs.
pub fn describe(rules: &[FaultRule]) -> String {
    let mut out = String::new();
    for (i, rule) in rules.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{:?}", rule.fault);
        if let Some(round) = rule.round {
            let _ = write!(out, " at round {round}");
        }
        if let Some(times) = rule.times {
            let _ = write!(out, ", {times} time(s)");
        }
        if let Some(percent) = rule.percent {
            let _ = write!(out, " on {percent}% of requests");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse() {
        let plan = FaultRule::parse_plan(
            "timeout@2x3, 503+retry-after=1@1x1,503%20,429+quota,slow=1500@2,recharge",
        )
        .unwrap();
        assert_eq!(
            plan[0],
            FaultRule {
                fault: Fault::Timeout,
                round: Some(2),
                times: Some(3),
                percent: None
            }
        );
        assert_eq!(
            plan[1].fault,
            Fault::Status {
                status: 503,
                retry_after: Some(RetryAfter::Seconds(1)),
                quota: false
            }
        );
        assert_eq!((plan[1].round, plan[1].times), (Some(1), Some(1)));
        assert_eq!((plan[2].percent, plan[2].round), (Some(20), None));
        assert_eq!(
            plan[3].fault,
            Fault::Status {
                status: 429,
                retry_after: None,
                quota: true
            }
        );
        assert_eq!(plan[4].fault, Fault::Slow(Duration::from_millis(1500)));
        assert_eq!(
            plan[5],
            FaultRule {
                fault: Fault::Recharge,
                round: None,
                times: None,
                percent: None
            }
        );
        assert!(FaultRule::parse_plan("").unwrap().is_empty());
    }

    #[test]
    fn bad_plans_say_what_is_wrong() {
        assert_eq!(
            FaultRule::parse_plan("explode@1").unwrap_err(),
            "fault \"explode@1\": unknown fault \"explode\""
        );
        assert!(
            FaultRule::parse_plan("200")
                .unwrap_err()
                .contains("not an error status")
        );
        assert!(
            FaultRule::parse_plan("timeout@two")
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            FaultRule::parse_plan("close+quota")
                .unwrap_err()
                .contains("takes no options")
        );
    }

    #[test]
    fn rules_are_spent_after_their_times() {
        let mut rules: Vec<(FaultRule, u32)> = FaultRule::parse_plan("close@2x2")
            .unwrap()
            .into_iter()
            .map(|r| (r, 0))
            .collect();
        assert_eq!(pick_fault(&mut rules, 1, 1).1, None);
        assert_eq!(pick_fault(&mut rules, 2, 2).1, Some(Fault::Close));
        assert_eq!(pick_fault(&mut rules, 2, 3).1, Some(Fault::Close));
        assert_eq!(pick_fault(&mut rules, 2, 4).1, None);
    }

    #[test]
    fn slow_composes_with_the_next_rule() {
        let mut rules: Vec<(FaultRule, u32)> = FaultRule::parse_plan("slow=100@2,recharge@2")
            .unwrap()
            .into_iter()
            .map(|r| (r, 0))
            .collect();
        assert_eq!(
            pick_fault(&mut rules, 2, 1),
            (Duration::from_millis(100), Some(Fault::Recharge))
        );
    }

    #[test]
    fn percent_rules_hit_about_that_share() {
        let mut rules: Vec<(FaultRule, u32)> = FaultRule::parse_plan("503%20")
            .unwrap()
            .into_iter()
            .map(|r| (r, 0))
            .collect();
        let hits = (1..=10_000)
            .filter(|n| pick_fault(&mut rules, 1, *n).1.is_some())
            .count();
        assert!((1_800..=2_200).contains(&hits), "{hits} of 10000");
    }
}
