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
    /// Send the first half of the answer (of a stream: its role and the first half of
    /// its text's pieces), then drop the connection.
    BreakStream,
    /// Answer 200 with text that never ends (a stream's pieces, or a JSON body's string).
    EndlessStream,
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
    /// Call `send_confirmation` before charging (when the tool is offered).
    ConfirmFirst,
    /// Call `send_confirmation` twice in one answer, after charging.
    DoubleConfirm,
    /// Answer what a real server once answered: a response recorded with `curl -i`.
    Replay(Recording),
    /// Refuse function tools beside a reasoning effort, as OpenAI's reasoning models do on
    /// chat completions: 400 `param: "reasoning_effort"` to a request with tools whose
    /// `reasoning_effort` is anything but `none`, absent included (the gpt-5.6 family
    /// thinks by default); a request with `none` is answered as the script would. OpenAI
    /// is not reachable from here and no server that runs here refuses so: a fake of our
    /// own, its body the one the provider sends (issue 48 quotes it).
    RefuseToolsWithReasoning,
    /// Answer as the script would, in a form some real servers use. Like `slow`, it lets
    /// the next matching rule choose the answer.
    Quirk(Quirk),
}

/// A form of answer that real OpenAI-compatible servers send and OpenAI does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quirk {
    /// `content: ""` rather than null beside tool calls (llama-server).
    EmptyContent,
    /// A sentence beside the tool calls.
    TextBeforeCall,
    /// `finish_reason: "stop"` on an answer with tool calls.
    FinishStop,
    /// `finish_reason: "tool_calls"` on an answer without any.
    FinishToolCalls,
    /// Tool-call arguments as a JSON object rather than a string of JSON.
    ObjectArguments,
    /// One tool-call id for every call, in every answer.
    SameId,
}

/// An HTTP response as `curl -s -i` wrote it to a file: status line, headers, body.
#[derive(Clone, PartialEq, Eq)]
pub struct Recording {
    pub path: String,
    pub status: u16,
    pub content_type: Option<String>,
    pub body: String,
}

impl Recording {
    pub fn read(path: &str) -> Result<Recording, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the recording {path:?}: {e}"))?;
        Recording::parse(path, &text)
    }

    fn parse(path: &str, text: &str) -> Result<Recording, String> {
        // CRLF as curl writes it; LF too, should a recording be edited by hand.
        let (head, body) = text
            .split_once("\r\n\r\n")
            .or_else(|| text.split_once("\n\n"))
            .ok_or_else(|| format!("{path:?} has no blank line between headers and body"))?;
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|code| code.parse::<u16>().ok())
            .filter(|code| (100..600).contains(code))
            .ok_or_else(|| format!("{path:?} does not start with an HTTP status line"))?;
        let content_type = lines.find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        });
        Ok(Recording {
            path: path.to_owned(),
            status,
            content_type,
            body: body.to_owned(),
        })
    }
}

impl std::fmt::Debug for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recording({:?}, status {})", self.path, self.status)
    }
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
    /// `timeout`, `close`, `slow=1500`, `malformed`, `break-stream`, `endless-stream`,
    /// `wrong-order`, `wrong-amount`,
    /// `double-charge`, `recharge` (alias `never-stop`), `no-charge`, `unknown-tool`,
    /// `bad-arguments`, `missing-field`, `numeric-amount`, `confirm-first`, `double-confirm`, `refuse-tools-with-reasoning`, `replay=PATH` (a `curl -i`
    /// recording; the path has no `@`, `+` or `,`), and the quirks `empty-content`,
    /// `text-before-call`, `finish-stop`, `finish-tool-calls`, `object-arguments`,
    /// `same-id`.
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
            Some(("replay", path)) => Fault::Replay(Recording::read(path)?),
            Some(_) => return Err(format!("unknown fault {head:?}")),
            None => match head {
                "timeout" => Fault::Timeout,
                "close" => Fault::Close,
                "malformed" => Fault::Malformed,
                "break-stream" => Fault::BreakStream,
                "endless-stream" => Fault::EndlessStream,
                "wrong-order" => Fault::WrongOrder,
                "wrong-amount" => Fault::WrongAmount,
                "double-charge" => Fault::DoubleCharge,
                "recharge" | "never-stop" => Fault::Recharge,
                "no-charge" => Fault::NoCharge,
                "unknown-tool" => Fault::UnknownTool,
                "bad-arguments" => Fault::BadArguments,
                "missing-field" => Fault::MissingField,
                "numeric-amount" => Fault::NumericAmount,
                "confirm-first" => Fault::ConfirmFirst,
                "double-confirm" => Fault::DoubleConfirm,
                "refuse-tools-with-reasoning" => Fault::RefuseToolsWithReasoning,
                "empty-content" => Fault::Quirk(Quirk::EmptyContent),
                "text-before-call" => Fault::Quirk(Quirk::TextBeforeCall),
                "finish-stop" => Fault::Quirk(Quirk::FinishStop),
                "finish-tool-calls" => Fault::Quirk(Quirk::FinishToolCalls),
                "object-arguments" => Fault::Quirk(Quirk::ObjectArguments),
                "same-id" => Fault::Quirk(Quirk::SameId),
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

/// What the plan makes of one request.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Pick {
    pub(super) extra: Duration,
    pub(super) quirks: Vec<Quirk>,
    pub(super) fault: Option<Fault>,
}

/// The fault for this request, any extra delay and quirks: `slow` and quirk rules add
/// theirs and let the next matching rule choose the answer, so they compose with faults.
pub(super) fn pick_fault(rules: &mut [(FaultRule, u32)], round: u32, number: u64) -> Pick {
    let mut pick = Pick::default();
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
            Fault::Slow(delay) => pick.extra += *delay,
            Fault::Quirk(quirk) => pick.quirks.push(*quirk),
            fault => {
                pick.fault = Some(fault.clone());
                return pick;
            }
        }
    }
    pick
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
        assert_eq!(pick_fault(&mut rules, 1, 1).fault, None);
        assert_eq!(pick_fault(&mut rules, 2, 2).fault, Some(Fault::Close));
        assert_eq!(pick_fault(&mut rules, 2, 3).fault, Some(Fault::Close));
        assert_eq!(pick_fault(&mut rules, 2, 4).fault, None);
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
            Pick {
                extra: Duration::from_millis(100),
                quirks: vec![],
                fault: Some(Fault::Recharge)
            }
        );
    }

    #[test]
    fn quirks_compose_with_the_next_rule() {
        let mut rules: Vec<(FaultRule, u32)> =
            FaultRule::parse_plan("same-id,object-arguments@1,double-charge@1")
                .unwrap()
                .into_iter()
                .map(|r| (r, 0))
                .collect();
        assert_eq!(
            pick_fault(&mut rules, 1, 1),
            Pick {
                extra: Duration::ZERO,
                quirks: vec![Quirk::SameId, Quirk::ObjectArguments],
                fault: Some(Fault::DoubleCharge)
            }
        );
        assert_eq!(
            pick_fault(&mut rules, 2, 2),
            Pick {
                extra: Duration::ZERO,
                quirks: vec![Quirk::SameId],
                fault: None
            }
        );
    }

    #[test]
    fn recordings_read_as_curl_wrote_them() {
        let crlf = "HTTP/1.1 401 Unauthorized\r\nServer: llama.cpp\r\nContent-Type: application/json; charset=utf-8\r\n\r\n{\"error\":{}}";
        let recording = Recording::parse("r.http", crlf).unwrap();
        assert_eq!(
            (
                recording.status,
                recording.content_type.as_deref(),
                recording.body.as_str()
            ),
            (
                401,
                Some("application/json; charset=utf-8"),
                "{\"error\":{}}"
            )
        );
        let lf = Recording::parse("r.http", "HTTP/1.1 200 OK\n\n{}").unwrap();
        assert_eq!(
            (lf.status, lf.content_type, lf.body.as_str()),
            (200, None, "{}")
        );
        assert!(
            Recording::parse("r.http", "{}")
                .unwrap_err()
                .contains("no blank line")
        );
        assert!(
            FaultRule::parse_plan("replay=/no/such/file.http@1")
                .unwrap_err()
                .contains("cannot read the recording \"/no/such/file.http\"")
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
            .filter(|n| pick_fault(&mut rules, 1, *n).fault.is_some())
            .count();
        assert!((1_800..=2_200).contains(&hits), "{hits} of 10000");
    }
}
