//! The binary's process calls: forwarding a signal to the program it runs, and confining the
//! program to CPUs (both from `rackmem-sys`), with the CPU-list option they take.

pub use rackmem_sys::process::send_signal;

/// Confines the calling thread, and the processes it starts from now on, to `cpus`.
pub fn pin_this_thread(cpus: &[usize]) -> std::io::Result<()> {
    rackmem_sys::process::set_thread_cpus(0, cpus)
}

/// CPUs to confine a program to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

/// Parses a CPU list for clap.
pub fn cpu_list(s: &str) -> Result<CpuList, String> {
    parse_cpu_list(s).map(CpuList)
}

/// Parses a CPU list as `taskset -c` takes it: `0`, `0,2`, `0-3,6`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let bad = || format!("`{s}` is not a CPU list: use numbers and ranges such as 0, 0,2 or 0-3");
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                );
                if a > b || b >= 1024 {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    if out.is_empty() || out.iter().any(|&c| c >= 1024) {
        return Err(bad());
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::parse_cpu_list;

    #[test]
    fn cpu_lists_parse_like_taskset() {
        assert_eq!(parse_cpu_list("0"), Ok(vec![0]));
        assert_eq!(parse_cpu_list("3,0-2,2"), Ok(vec![0, 1, 2, 3]));
        for bad in ["", "a", "2-1", "0-", "-1", "5000"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?}");
        }
    }
}
