//! The figures: medians of runs with min and max, their targets, the table, the JSON.

use serde::Serialize;

/// How a figure is judged.
#[derive(Clone, Copy, Debug, Serialize)]
pub enum Target {
    AtMost(f64),
    AtLeast(f64),
    Exactly(f64),
}

impl Target {
    pub fn met(&self, value: f64) -> bool {
        match *self {
            Target::AtMost(t) => value <= t,
            Target::AtLeast(t) => value >= t,
            Target::Exactly(t) => (value - t).abs() < 1e-9,
        }
    }

    fn text(&self) -> String {
        match *self {
            Target::AtMost(t) => format!("<= {}", num(t)),
            Target::AtLeast(t) => format!(">= {}", num(t)),
            Target::Exactly(t) => format!("= {}", num(t)),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Metric {
    pub figure: u8,
    pub name: String,
    pub db: String,
    pub unit: String,
    pub runs: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// Judged on the median; for `Exactly` and success rates, on every run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub met: Option<bool>,
}

impl Metric {
    pub fn new(figure: u8, name: &str, db: &str, unit: &str, runs: Vec<f64>) -> Metric {
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        let (median, min, max) = if sorted.is_empty() {
            (f64::NAN, f64::NAN, f64::NAN)
        } else {
            let n = sorted.len();
            let median = if n % 2 == 1 {
                sorted[n / 2]
            } else {
                (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
            };
            (median, sorted[0], sorted[n - 1])
        };
        Metric {
            figure,
            name: name.to_owned(),
            db: db.to_owned(),
            unit: unit.to_owned(),
            runs,
            median,
            min,
            max,
            target: None,
            met: None,
        }
    }

    pub fn target(mut self, target: Target) -> Metric {
        self.met = Some(target.met(self.median));
        self.target = Some(target);
        self
    }

    /// A target every run must meet (success, receipts per order).
    pub fn target_every_run(mut self, target: Target) -> Metric {
        self.met = Some(!self.runs.is_empty() && self.runs.iter().all(|v| target.met(*v)));
        self.target = Some(target);
        self
    }
}

/// Numbers as a person writes them: few digits, no trailing zeros.
pub fn num(v: f64) -> String {
    if v.is_nan() {
        return "-".into();
    }
    let a = v.abs();
    let s = if a >= 1000.0 || (a - a.round()).abs() < 1e-9 && a >= 10.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// The table, one line per metric, as plain text (also valid Markdown).
pub fn table(metrics: &[Metric]) -> String {
    let header = [
        "#", "figure", "db", "median", "min", "max", "unit", "runs", "target", "met",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for m in metrics {
        rows.push(vec![
            m.figure.to_string(),
            m.name.clone(),
            m.db.clone(),
            num(m.median),
            num(m.min),
            num(m.max),
            m.unit.clone(),
            m.runs.len().to_string(),
            m.target.map(|t| t.text()).unwrap_or_default(),
            match m.met {
                Some(true) => "yes".into(),
                Some(false) => "NO".into(),
                None => String::new(),
            },
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        out.push('|');
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            // Numbers right-aligned, words left-aligned.
            if (3..=5).contains(&c) && i > 0 {
                out.push_str(&format!(" {}{} |", " ".repeat(pad), cell));
            } else {
                out.push_str(&format!(" {}{} |", cell, " ".repeat(pad)));
            }
        }
        out.push('\n');
        if i == 0 {
            out.push('|');
            for w in &widths {
                out.push_str(&format!("{}|", "-".repeat(w + 2)));
            }
            out.push('\n');
        }
    }
    out
}
