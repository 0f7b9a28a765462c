//! What the benchmark reads about a process from /proc: CPU time, memory, descriptors.

use std::path::Path;
use std::time::Duration;

/// Clock ticks per second of /proc/PID/stat's utime and stime (`getconf CLK_TCK`).
pub fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100)
}

/// User + system CPU time of the process `pid` (`self` for this one), all threads,
/// exited ones included.
pub fn cpu_time(pid: &str, ticks_per_sec: u64) -> std::io::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces: skip past it.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| std::io::Error::other("unexpected /proc/PID/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15.
    let field = |n: usize| -> std::io::Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no field {n} in /proc/PID/stat")))
    };
    let ticks = field(14)? + field(15)?;
    Ok(Duration::from_nanos(ticks * 1_000_000_000 / ticks_per_sec))
}

/// A `kB` line of /proc/PID/status (`VmHWM`, `VmRSS`), in bytes.
pub fn status_kb(pid: u32, name: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(':')?;
        let kb: u64 = value.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// Open file descriptors of `pid`, and how many of them are the file `path`.
pub fn descriptors(pid: u32, path: Option<&Path>) -> (u32, u32) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return (0, 0);
    };
    let mut all = 0;
    let mut on_path = 0;
    for entry in dir.flatten() {
        all += 1;
        if let (Some(path), Ok(target)) = (path, std::fs::read_link(entry.path()))
            && target == path
        {
            on_path += 1;
        }
    }
    (all, on_path)
}

/// The soft and hard limit on open files of `pid`.
pub fn open_files_limit(pid: &str) -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut numbers = line
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok());
    Some((numbers.next()?, numbers.next()?))
}

/// A one-line description of this machine: CPU model, cores, memory, kernel.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{model}, {cores} cores, {mem_gib:.0} GiB RAM, Linux {}",
        kernel.trim()
    )
}
