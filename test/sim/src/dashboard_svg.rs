//! The README's picture of the Grafana dashboard (`config/prometheus/dashboard.json`), which
//! cannot run here: for each panel, the series its queries read, taken from scrapes of the
//! controller's `/metrics` during a sim scenario, drawn as an SVG. Counters and ratios are drawn
//! as exported (a query's `increase(...)` or `/ 86400` is not evaluated).

use std::collections::BTreeMap;
use std::fmt::Write;

/// One scrape of the controller's metrics, `at` seconds after the first.
pub struct Scrape {
    pub at: f64,
    pub text: String,
}

const PANEL_W: f64 = 460.0;
const PANEL_H: f64 = 232.0;
const COLUMNS: usize = 2;
const COLORS: &[&str] = &["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"];

/// One line of a panel: its legend and its points.
type Series = (String, Vec<(f64, f64)>);

/// The SVG of every panel of `dashboard` over `scrapes`, for the EtcdadmCluster `name`.
pub fn render(dashboard: &serde_json::Value, scrapes: &[Scrape], name: &str) -> String {
    let panels: Vec<(String, Vec<Series>)> = dashboard["panels"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|p| p["type"] == "timeseries")
        .map(|p| {
            let metrics: Vec<String> = p["targets"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(|t| first_metric(t["expr"].as_str()?))
                .collect();
            let series = metrics.iter().flat_map(|m| series_of(m, scrapes, name)).collect();
            (p["title"].as_str().unwrap_or("").to_string(), series)
        })
        .collect();
    let rows = panels.len().div_ceil(COLUMNS);
    let (width, height) = (PANEL_W * COLUMNS as f64, PANEL_H * rows as f64);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
    );
    for (i, (title, series)) in panels.iter().enumerate() {
        let x = PANEL_W * (i % COLUMNS) as f64;
        let y = PANEL_H * (i / COLUMNS) as f64;
        panel(&mut svg, x, y, title, series);
    }
    svg.push_str("</svg>\n");
    svg
}

/// The first `etcdadm_` metric a query names.
fn first_metric(expr: &str) -> Option<String> {
    let start = expr.find("etcdadm_")?;
    let name: String = expr[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    Some(name)
}

/// Every series of `metric` for cluster `name`: one per other label set, legend `metric{labels}`.
fn series_of(metric: &str, scrapes: &[Scrape], name: &str) -> Vec<Series> {
    let wanted = format!("name=\"{name}\"");
    let mut by_labels: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for scrape in scrapes {
        for line in scrape.text.lines() {
            let Some(rest) = line.strip_prefix(metric) else {
                continue;
            };
            let Some((labels, value)) = rest.strip_prefix('{').and_then(|r| r.split_once("} ")) else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            if !labels.split(',').any(|l| l == wanted) {
                continue;
            }
            let others: Vec<&str> = labels
                .split(',')
                .filter(|l| !l.starts_with("namespace=") && !l.starts_with("name="))
                .collect();
            by_labels
                .entry(format!("{metric}{{{}}}", others.join(",")))
                .or_default()
                .push((scrape.at, value));
        }
    }
    by_labels.into_iter().collect()
}

fn panel(svg: &mut String, x: f64, y: f64, title: &str, series: &[Series]) {
    let (left, top, w, h) = (x + 48.0, y + 22.0, PANEL_W - 60.0, PANEL_H - 102.0);
    let points = series.iter().flat_map(|(_, p)| p);
    let (t_max, v_max) = points.fold((1.0f64, 0.0f64), |(t, v), (pt, pv)| (t.max(*pt), v.max(*pv)));
    let v_max = if v_max > 0.0 { v_max * 1.1 } else { 1.0 };
    let _ = writeln!(
        svg,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f7f7f7\" stroke=\"#dddddd\"/>\n<text x=\"{}\" y=\"{}\" font-weight=\"bold\">{}</text>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0} s</text>",
        x + 4.0,
        y + 4.0,
        PANEL_W - 8.0,
        PANEL_H - 8.0,
        x + 12.0,
        y + 17.0,
        escape(title),
        left - 4.0,
        top + 8.0,
        short(v_max, series.iter().all(|(legend, _)| legend.contains("_bytes"))),
        left - 4.0,
        top + h,
        left + w,
        top + h + 13.0,
        t_max
    );
    if series.is_empty() {
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"#888888\">no samples</text>",
            left + 8.0,
            top + h / 2.0
        );
    }
    for (i, (legend, samples)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let line: Vec<String> = samples
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", left + w * t / t_max, top + h - h * v / v_max))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>",
            line.join(" ")
        );
        if i < 4 {
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{}</text>",
                x + 12.0,
                top + h + 26.0 + i as f64 * 12.0,
                escape(&truncate(legend, 72))
            );
        }
    }
    if series.len() > 4 {
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"#888888\">and {} more series</text>",
            x + 12.0,
            top + h + 74.0,
            series.len() - 4
        );
    }
}

/// `v` in a few characters: binary units for bytes (`512.0Mi`), else decimal (`31.5M`, `3`).
fn short(v: f64, bytes: bool) -> String {
    let (k, units) = if bytes {
        (1024.0, ["Ki", "Mi", "Gi"])
    } else {
        (1000.0, ["k", "M", "G"])
    };
    let mut scaled = v;
    let mut unit = "";
    for u in units {
        if scaled < k {
            break;
        }
        scaled /= k;
        unit = u;
    }
    match scaled {
        s if !unit.is_empty() => format!("{s:.1}{unit}"),
        s if s >= 10.0 => format!("{s:.0}"),
        s => format!("{s:.2}"),
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    text.chars().take(max - 1).chain(['…']).collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_panel_draws_the_series_its_queries_read_for_the_cluster() {
        let dashboard = serde_json::json!({"panels": [
            {"type": "row", "title": "skipped"},
            {"type": "timeseries", "title": "DB <size>", "targets": [
                {"expr": "etcdadm_member_db_size_bytes{namespace=\"$namespace\",name=\"$name\"}"}]},
            {"type": "timeseries", "title": "Defragmentations", "targets": [
                {"expr": "increase(etcdadm_defragmentations_total{name=\"$name\"}[5m])"}]},
        ]});
        let text = |a: u32, b: u32| {
            format!(
                "etcdadm_member_db_size_bytes{{namespace=\"default\",name=\"d1-etcd\",member=\"m1\"}} {a}\n\
                 etcdadm_member_db_size_bytes{{namespace=\"default\",name=\"other\",member=\"x\"}} 7\n\
                 etcdadm_member_db_size_bytes_other{{namespace=\"default\",name=\"d1-etcd\"}} 9\n\
                 etcdadm_defragmentations_total{{namespace=\"default\",name=\"d1-etcd\",trigger=\"policy\"}} {b}\n"
            )
        };
        let scrapes = [
            Scrape {
                at: 0.0,
                text: text(100, 0),
            },
            Scrape {
                at: 2.0,
                text: text(50, 1),
            },
        ];
        let svg = render(&dashboard, &scrapes, "d1-etcd");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("DB &lt;size&gt;") && !svg.contains("skipped"));
        assert!(svg.contains("etcdadm_member_db_size_bytes{member=\"m1\"}"));
        assert!(svg.contains("etcdadm_defragmentations_total{trigger=\"policy\"}"));
        assert_eq!(
            svg.matches("<polyline").count(),
            2,
            "other clusters and metrics left out"
        );
        assert_eq!(short(3.0 * 1024.0 * 1024.0, true), "3.0Mi");
        assert_eq!(short(31_536_000.0, false), "31.5M");
        assert_eq!(short(3.0, false), "3.00");
        let series = series_of("etcdadm_member_db_size_bytes", &scrapes, "d1-etcd");
        assert_eq!(series[0].1, vec![(0.0, 100.0), (2.0, 50.0)]);
    }
}
