//! The plot of latency against concurrency, as hand-written SVG: one panel for the
//! instant model (the service's own cost), one for the 2 s model (loops in flight).

use std::fmt::Write as _;

use crate::report::num;

pub struct Series {
    pub label: String,
    pub color: &'static str,
    pub dashed: bool,
    /// (concurrency, milliseconds)
    pub points: Vec<(f64, f64)>,
}

pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// A horizontal line: (value, label).
    pub limit: Option<(f64, String)>,
}

const W: f64 = 520.0;
const H: f64 = 400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 110.0;

fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    for step in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if step * magnitude >= v {
            return step * magnitude;
        }
    }
    10.0 * magnitude
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn panel(out: &mut String, p: &Panel, x0: f64) {
    let xs: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|pt| pt.0))
        .collect();
    let (xmin, xmax) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
    let (lxmin, lxmax) = if xs.is_empty() {
        (0.0, 1.0)
    } else {
        (xmin.max(1.0).log10(), xmax.max(10.0).log10())
    };
    let span = (lxmax - lxmin).max(1e-9);
    let ymax_data = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|pt| pt.1))
        .chain(p.limit.as_ref().map(|l| l.0 * 1.1))
        .fold(0.0_f64, f64::max);
    let ymax = nice_ceiling(ymax_data * 1.05);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let px = |x: f64| x0 + LEFT + (x.max(1.0).log10() - lxmin) / span * pw;
    let py = |y: f64| TOP + ph - (y.max(0.0) / ymax) * ph;

    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="24" font-size="15" font-weight="bold" text-anchor="middle">{}</text>"#,
        x0 + LEFT + pw / 2.0,
        escape(&p.title)
    );
    // Grid and y ticks.
    for i in 0..=5 {
        let v = ymax * i as f64 / 5.0;
        let y = py(v);
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            x0 + LEFT,
            x0 + LEFT + pw,
            x0 + LEFT - 6.0,
            y + 4.0,
            num(v)
        );
    }
    // x ticks at the measured concurrencies.
    let mut ticks: Vec<f64> = xs.clone();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for x in ticks {
        let _ = writeln!(
            out,
            r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#eee"/><text x="{0:.1}" y="{3:.1}" font-size="11" text-anchor="middle">{4}</text>"##,
            px(x),
            TOP,
            TOP + ph,
            TOP + ph + 16.0,
            num(x)
        );
    }
    let _ = writeln!(
        out,
        r##"<rect x="{:.1}" y="{TOP}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#333"/>"##,
        x0 + LEFT
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">concurrent checkouts (log scale)</text>"#,
        x0 + LEFT + pw / 2.0,
        TOP + ph + 34.0
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate({:.1},{:.1}) rotate(-90)" font-size="12" text-anchor="middle">{}</text>"#,
        x0 + 16.0,
        TOP + ph / 2.0,
        escape(&p.y_label)
    );
    if let Some((value, label)) = &p.limit {
        let y = py(*value);
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#c00" stroke-dasharray="2,3"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#c00" text-anchor="end">{}</text>"##,
            x0 + LEFT,
            x0 + LEFT + pw,
            x0 + LEFT + pw - 4.0,
            y - 4.0,
            escape(label)
        );
    }
    for s in &p.series {
        let mut points = s.points.clone();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            path.join(" "),
            s.color
        );
        for (x, y) in &points {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"><title>{}: {} at {}</title></circle>"#,
                px(*x),
                py(*y),
                s.color,
                escape(&s.label),
                num(*y),
                num(*x)
            );
        }
    }
    // Legend below the axis label.
    for (i, s) in p.series.iter().enumerate() {
        let lx = x0 + LEFT + (i % 2) as f64 * (pw / 2.0);
        let ly = TOP + ph + 54.0 + (i / 2) as f64 * 16.0;
        let dash = if s.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let _ = writeln!(
            out,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            lx + 24.0,
            s.color,
            lx + 30.0,
            ly + 4.0,
            escape(&s.label)
        );
    }
}

pub fn render(panels: &[Panel], caption: &str) -> String {
    let width = W * panels.len() as f64;
    let height = H + 20.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, p) in panels.iter().enumerate() {
        panel(&mut out, p, W * i as f64);
    }
    close(out, height, caption)
}

/// A line of the timeline: its label, its colour, its (ms, value) points.
pub type Line = (String, &'static str, Vec<(f64, f64)>);

/// A timeline (figure 8): lines over time in seconds, a shaded window (the outage) and,
/// in a strip under the plot, bands of the breaker's state (`closed`, `half_open`,
/// `open`) with a tick at each trial request, all on one linear time axis.
pub fn timeline(
    series: &[Line],
    bands: &[(f64, f64, String)],
    trials: &[f64],
    window: (f64, f64),
    title: &str,
    caption: &str,
) -> String {
    let (width, height) = (900.0, 440.0);
    let (left, right, top) = (70.0, 20.0, 50.0);
    let ph = 260.0;
    let pw = width - left - right;
    let tmax = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.0))
        .chain(bands.iter().map(|b| b.1))
        .fold(1.0_f64, f64::max);
    let ymax = nice_ceiling(
        series
            .iter()
            .flat_map(|s| s.2.iter().map(|p| p.1))
            .fold(0.0_f64, f64::max)
            * 1.05,
    );
    let px = |t: f64| left + (t / tmax).clamp(0.0, 1.0) * pw;
    let py = |y: f64| top + ph - (y.max(0.0) / ymax) * ph;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="24" font-size="15" font-weight="bold" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        escape(title)
    );
    if window.0.is_finite() && window.1.is_finite() {
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{top}" width="{:.1}" height="{ph}" fill="#eee"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#555" text-anchor="middle">primary down</text>"##,
            px(window.0),
            px(window.1) - px(window.0),
            (px(window.0) + px(window.1)) / 2.0,
            top + 14.0
        );
    }
    for i in 0..=5 {
        let v = ymax * i as f64 / 5.0;
        let y = py(v);
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0,
            num(v)
        );
    }
    // The breaker strip.
    let (sy, sh) = (top + ph + 28.0, 18.0);
    for (from, to, state) in bands {
        let color = match state.as_str() {
            "closed" => "#b7e1b7",
            "open" => "#f4a6a6",
            "half_open" => "#f7dc84",
            _ => "#ffffff",
        };
        let _ = writeln!(
            out,
            r#"<rect x="{:.1}" y="{sy}" width="{:.1}" height="{sh}" fill="{color}"><title>breaker {}: {:.1}..{:.1} s</title></rect>"#,
            px(*from),
            (px(*to) - px(*from)).max(0.5),
            escape(state),
            from / 1000.0,
            to / 1000.0
        );
    }
    for t in trials {
        let _ = writeln!(
            out,
            r#"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="black" stroke-width="2"><title>trial request at {3:.1} s</title></line>"#,
            px(*t),
            sy - 4.0,
            sy + sh + 4.0,
            t / 1000.0
        );
    }
    let _ = writeln!(
        out,
        r##"<rect x="{left}" y="{sy}" width="{pw:.1}" height="{sh}" fill="none" stroke="#333"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">breaker</text>"##,
        left - 6.0,
        sy + 13.0
    );
    let mut t = 0.0;
    while t <= tmax / 1000.0 + 1e-9 {
        let x = px(t * 1000.0);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
            top + ph,
            top + ph + 16.0,
            num(t)
        );
        t += 1.0;
    }
    let _ = writeln!(
        out,
        r##"<rect x="{left}" y="{top}" width="{pw:.1}" height="{ph}" fill="none" stroke="#333"/><text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">seconds since the load started</text><text transform="translate(16,{:.1}) rotate(-90)" font-size="12" text-anchor="middle">per second</text>"##,
        left + pw / 2.0,
        sy + sh + 16.0,
        top + ph / 2.0
    );
    for (label, color, points) in series {
        let path: Vec<String> = points
            .iter()
            .map(|(t, y)| format!("{:.1},{:.1}", px(*t), py(*y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"><title>{}</title></polyline>"#,
            path.join(" "),
            escape(label)
        );
    }
    let ly = sy + sh + 36.0;
    let mut lx = left;
    for (label, color, _) in series {
        let _ = writeln!(
            out,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(label)
        );
        lx += 190.0;
    }
    for (state, color) in [
        ("closed", "#b7e1b7"),
        ("half open", "#f7dc84"),
        ("open", "#f4a6a6"),
    ] {
        let _ = writeln!(
            out,
            r#"<rect x="{lx:.1}" y="{:.1}" width="14" height="10" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="11">{state}</text>"#,
            ly - 5.0,
            lx + 18.0,
            ly + 4.0
        );
        lx += 70.0;
    }
    let _ = writeln!(
        out,
        r#"<line x1="{lx:.1}" y1="{:.1}" x2="{lx:.1}" y2="{:.1}" stroke="black" stroke-width="2"/><text x="{:.1}" y="{:.1}" font-size="11">trial</text>"#,
        ly - 6.0,
        ly + 6.0,
        lx + 6.0,
        ly + 4.0
    );
    close(out, height, caption)
}

/// The caption at the foot of a picture, and its end.
fn close(mut out: String, height: f64, caption: &str) -> String {
    let _ = writeln!(
        out,
        r##"<text x="10" y="{:.0}" font-size="10" fill="#555">{}</text>"##,
        height - 8.0,
        escape(caption)
    );
    out.push_str("</svg>\n");
    out
}
