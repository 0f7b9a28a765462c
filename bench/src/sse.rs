//! The load generator's side of `--stream` (figure 12): each checkout's Server-Sent
//! Events read to the end, and what the streams of a load delivered.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::load::{Percentiles, Sample};

/// What the event streams of a `--stream` load delivered (figure 12).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StreamReport {
    /// Streams answered 200 (`text/event-stream`).
    pub streams: u64,
    /// Streams whose last event is `RUN_FINISHED` with the outcome `success`.
    pub finished: u64,
    /// The other streams, by how they ended: `RUN_ERROR <code>`, `RUN_FINISHED
    /// <outcome>`, `cut after <type>` (no last event), `no events`.
    pub ended_otherwise: BTreeMap<String, u64>,
    /// Events received, keep-alive comments not counted.
    pub events: u64,
    /// From the first request sent to the last event received, in ms.
    pub span_ms: f64,
    /// From a request sent to its first event.
    pub first_event: Percentiles,
    /// From a request sent to its last event.
    pub last_event: Percentiles,
}

/// What one event stream delivered.
#[derive(Debug, Default)]
pub(crate) struct Streamed {
    /// When its first and last events came, in µs since the load's start.
    pub(crate) first_us: Option<u64>,
    pub(crate) last_us: Option<u64>,
    pub(crate) events: u64,
    /// `None`: its last event is `RUN_FINISHED` with the outcome `success`; else how it
    /// ended (a key of [`StreamReport::ended_otherwise`]).
    pub(crate) ended: Option<String>,
}

pub(crate) fn is_event_stream(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Reads a stream of Server-Sent Events to its end: what it delivered, and the body the
/// JSON form would have answered (`RUN_FINISHED`'s `result`), else its last event.
pub(crate) async fn read_stream(
    mut response: reqwest::Response,
    start: Instant,
) -> Result<(Streamed, Vec<u8>), String> {
    let mut streamed = Streamed::default();
    let mut buffer: Vec<u8> = Vec::new();
    let mut last = String::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("reading the stream: {e}"))?
    {
        let now = start.elapsed().as_micros() as u64;
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            // A comment (the keep-alive) has no data.
            if data.is_empty() {
                continue;
            }
            streamed.events += 1;
            streamed.first_us.get_or_insert(now);
            streamed.last_us = Some(now);
            last = data.join("\n");
        }
    }
    let event: serde_json::Value = serde_json::from_str(&last).unwrap_or_default();
    let text = |pointer: &str| event.pointer(pointer).and_then(|v| v.as_str());
    streamed.ended = match (text("/type"), text("/outcome/type")) {
        (Some("RUN_FINISHED"), Some("success")) => None,
        (Some("RUN_FINISHED"), outcome) => Some(format!("RUN_FINISHED {}", outcome.unwrap_or("-"))),
        (Some("RUN_ERROR"), _) => Some(format!("RUN_ERROR {}", text("/code").unwrap_or("-"))),
        (Some(other), _) => Some(format!("cut after {other}")),
        (None, _) if streamed.events == 0 => Some("no events".into()),
        (None, _) => Some("cut after an event without a type".into()),
    };
    let body = match event.get("result") {
        Some(result) => serde_json::to_vec(result).unwrap_or_default(),
        None => last.into_bytes(),
    };
    Ok((streamed, body))
}

/// The streams' figures of a `--stream` load.
pub(crate) fn stream_report(samples: &[Sample]) -> StreamReport {
    let mut report = StreamReport::default();
    let (mut first, mut last) = (Vec::new(), Vec::new());
    let (mut begin, mut end) = (u64::MAX, 0);
    for s in samples {
        begin = begin.min(s.start_us);
        let Some(stream) = &s.stream else { continue };
        report.streams += 1;
        report.events += stream.events;
        match &stream.ended {
            None => report.finished += 1,
            Some(how) => *report.ended_otherwise.entry(how.clone()).or_insert(0) += 1,
        }
        if let (Some(f), Some(l)) = (stream.first_us, stream.last_us) {
            first.push(f.saturating_sub(s.start_us));
            last.push(l.saturating_sub(s.start_us));
            end = end.max(l);
        }
    }
    report.span_ms = end.saturating_sub(begin.min(end)) as f64 / 1000.0;
    report.first_event = Percentiles::of(first);
    report.last_event = Percentiles::of(last);
    report
}
