//! What the scenarios print, kept for BENCHMARKS.md: the Markdown they
//! write (through [`out!`](crate::out)), summaries of repeated
//! measurements, the machine's description, and the dated section
//! `--write` inserts into BENCHMARKS.md.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Everything printed through [`emit`] so far.
static OUT: Mutex<String> = Mutex::new(String::new());

/// Prints a line of Markdown and keeps it for BENCHMARKS.md.
pub fn emit(line: &str) {
    println!("{line}");
    let mut out = OUT.lock().unwrap_or_else(|e| e.into_inner());
    out.push_str(line);
    out.push('\n');
}

/// The Markdown printed so far.
pub fn printed() -> String {
    OUT.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The median of repeated measurements and their spread: the 10th and 90th
/// percentiles (nearest rank, so with fewer than ten samples, the smallest
/// and the largest).
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

impl Summary {
    pub fn of(samples: &[f64]) -> Self {
        assert!(!samples.is_empty(), "no samples to summarize");
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Self {
            median: quantile(&sorted, 0.5),
            p10: quantile(&sorted, 0.1),
            p90: quantile(&sorted, 0.9),
        }
    }

    /// Of durations, in milliseconds.
    pub fn ms(samples: &[Duration]) -> Self {
        Self::of(
            &samples
                .iter()
                .map(|d| d.as_secs_f64() * 1e3)
                .collect::<Vec<_>>(),
        )
    }

    /// Applies `f` to each figure (for rates, `f` reverses the order, which
    /// [`Summary::cell`] puts back).
    pub fn map(self, f: impl Fn(f64) -> f64) -> Self {
        let (a, b) = (f(self.p10), f(self.p90));
        Self {
            median: f(self.median),
            p10: a.min(b),
            p90: a.max(b),
        }
    }

    /// `12.3 (11.9–13.0)` with `decimals` decimals.
    pub fn cell(&self, decimals: usize) -> String {
        format!(
            "{:.d$} ({:.d$}–{:.d$})",
            self.median,
            self.p10,
            self.p90,
            d = decimals
        )
    }
}

/// Nearest-rank quantile of sorted samples.
pub fn quantile<T: Copy>(sorted: &[T], q: f64) -> T {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The value of the first `key: value` line in `/proc/cpuinfo` or
/// `/proc/meminfo` text.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim())
}

fn command(program: &str, args: &[&str], dir: &Path) -> Option<String> {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// `ad1d329`, with ` + uncommitted changes` when the work tree differs.
pub fn commit(root: &Path) -> String {
    let Some(head) = command("git", &["rev-parse", "--short", "HEAD"], root) else {
        return "unknown (no git)".into();
    };
    match command("git", &["status", "--porcelain"], root) {
        Some(status) if status.is_empty() => head,
        Some(_) => format!("{head} + uncommitted changes"),
        None => format!("{head} (work tree state unknown)"),
    }
}

/// The 1-minute load average.
pub fn load() -> String {
    read("/proc/loadavg")
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}

/// One line describing this machine: CPU, cores, memory, OS and kernel,
/// the compiler, and the GPU (`gpu`: the Vulkan adapter the compute
/// backend found, if any).
pub fn machine(gpu: Option<&str>) -> String {
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = field(&cpuinfo, "model name")
        .or_else(|| field(&cpuinfo, "Model"))
        .unwrap_or("unknown CPU");
    let memory = field(&read("/proc/meminfo"), "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or("unknown memory".to_string(), |kib| {
            format!("{:.1} GiB memory", kib / (1 << 20) as f64)
        });
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| std::env::consts::OS.to_string());
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    let rustc = command("rustc", &["--version"], Path::new("."))
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_string))
        .map_or(String::new(), |v| format!(", rustc {v}"));
    let gpu = gpu.map_or("no GPU".to_string(), |g| format!("GPU: {g}"));
    format!(
        "{cpu}, {} cores, {memory}, {os}, Linux {kernel}{rustc}, {gpu}",
        super::cores()
    )
}

/// `2026-11-22 14:05 UTC`.
pub fn now_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let (hour, minute) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02} UTC")
}

/// What the section's header says.
pub struct Header {
    pub date: String,
    pub commit: String,
    pub command: String,
    pub machine: String,
    pub load_before: String,
    pub load_after: String,
    pub took: Duration,
    pub note: Option<String>,
}

/// The dated section: header, then every table the run printed.
pub fn section(header: &Header, body: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## {}, commit {}\n", header.date, header.commit);
    let _ = writeln!(
        s,
        "`{}`, written by the command itself. Machine: {}. Load average {} before, {} after; \
         the run took {}.",
        header.command,
        header.machine,
        header.load_before,
        header.load_after,
        duration_text(header.took)
    );
    if let Some(note) = &header.note {
        let _ = writeln!(s, "\n{note}");
    }
    let _ = writeln!(
        s,
        "\nRepeated timings are given as median (p10–p90, nearest rank: with fewer than ten \
         runs, min–max) unless a table says otherwise."
    );
    s.push_str(body.trim_end());
    s.push_str("\n\n");
    // One blank line between blocks, however the scenarios spaced them.
    while s.contains("\n\n\n") {
        s = s.replace("\n\n\n", "\n\n");
    }
    s
}

fn duration_text(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 {
        format!("{} min {} s", secs / 60, secs % 60)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Inserts `section` into the Markdown `doc` before its first `## ` heading
/// (below the introduction and the command block, above older sections),
/// or at the end when it has none.
pub fn insert_section(doc: &str, section: &str) -> String {
    let mut offset = 0;
    let mut in_code = false;
    for line in doc.split_inclusive('\n') {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && line.starts_with("## ") {
            return format!("{}{section}{}", &doc[..offset], &doc[offset..]);
        }
        offset += line.len();
    }
    let mut out = doc.to_string();
    if !out.is_empty() && !out.ends_with("\n\n") {
        out.push_str(if out.ends_with('\n') { "\n" } else { "\n\n" });
    }
    out.push_str(section);
    out
}

/// Writes `section` into the file at `path` (created if missing).
pub fn write_section(path: &Path, section: &str) -> std::io::Result<()> {
    let doc = std::fs::read_to_string(path).unwrap_or_default();
    let updated = insert_section(&doc, section);
    let tmp = path.with_extension("md.tmp");
    std::fs::write(&tmp, updated)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_go_above_the_older_ones() {
        let doc = "# B\n\nintro\n\n```sh\n## not a heading\n```\n\n## old\n\ntext\n";
        let out = insert_section(doc, "## new\n\nnumbers\n\n");
        assert_eq!(
            out,
            "# B\n\nintro\n\n```sh\n## not a heading\n```\n\n## new\n\nnumbers\n\n## old\n\ntext\n"
        );
        assert_eq!(insert_section("# B\n", "## new\n"), "# B\n\n## new\n");
    }

    #[test]
    fn summaries_are_nearest_rank() {
        let s = Summary::of(&[5.0, 1.0, 3.0]);
        assert_eq!((s.median, s.p10, s.p90), (3.0, 1.0, 5.0));
        let s = Summary::of(&(1..=21).map(f64::from).collect::<Vec<_>>());
        assert_eq!((s.median, s.p10, s.p90), (11.0, 3.0, 19.0));
        let rate = Summary::of(&[1.0, 2.0, 4.0]).map(|x| 1.0 / x);
        assert_eq!((rate.median, rate.p10, rate.p90), (0.5, 0.25, 1.0));
        assert_eq!(Summary::of(&[1.0, 2.0, 4.0]).cell(1), "2.0 (1.0–4.0)");
    }

    #[test]
    fn dates_are_civil_utc() {
        let date = now_utc();
        assert_eq!(date.len(), "2026-11-22 14:05 UTC".len(), "{date}");
        assert!(date.starts_with("20"), "{date}");
    }
}
