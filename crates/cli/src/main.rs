//! `rackmem`: run unmodified programs on remote memory, serve memory bricks.
//!
//! This binary only parses arguments and wires the libraries together: `rackmem-brick` serves
//! memory, `rackmem-transport` reaches bricks, `librackmem.so` (`rackmem-preload` over
//! `rackmem-runtime`) does the work inside the program.

mod agent_cmd;
mod bench_cmd;
mod brick_cmd;
mod camat;
mod client_args;
mod control_cmd;
mod ctl_cmd;
mod migrate_cmd;
mod model_cmd;
mod reach;
mod run_cmd;
mod sys;
mod top_cmd;
mod values;

use clap::{Parser, Subcommand};

/// Exit statuses of `rackmem` itself (a program run with `rackmem run` keeps its own).
pub mod exit {
    /// A brick named on the command line cannot be reached.
    pub const BRICK_UNREACHABLE: i32 = 69;
    /// This user may not open a userfaultfd (the message says how to allow it).
    pub const NO_PERMISSION: i32 = 77;
    /// Something on this machine is missing or failed (library not found, socket error).
    pub const SOFTWARE: i32 = 70;
    /// The program could not be started (not found, not executable).
    pub const CANNOT_EXEC: i32 = 126;
}

#[derive(Parser)]
#[command(
    name = "rackmem",
    version,
    about = "Software-defined disaggregated memory: run unmodified programs on memory borrowed from other machines",
    long_about = "rackmem lends idle memory of some machines (memory bricks) to programs on others.\n\n\
        Quick start (one machine, embedded brick, local buffer of 10% of the footprint):\n  \
        rackmem run --local 10% --stats -- python3 -c 'x = bytearray(200 << 20); print(sum(x))'\n\n\
        Two machines:\n  \
        memory-rich$ rackmem brick --listen tcp://0.0.0.0:7070 --size 64GiB --secret-file /etc/rackmem.secret\n  \
        compute$     rackmem run --brick tcp://memory-rich:7070 --secret-file /etc/rackmem.secret --local 25% -- ./app\n\n\
        The same across an untrusted network, inside TLS (certificate verified against your CA):\n  \
        memory-rich$ rackmem brick --listen tls://0.0.0.0:7070 --tls-cert brick.pem --tls-key brick.key --size 64GiB \
        --secret-file /etc/rackmem.secret\n  \
        compute$     rackmem run --brick tls://memory-rich:7070 --tls-ca ca.pem --secret-file /etc/rackmem.secret -- ./app\n\n\
        A cluster with a control plane (segments granted on demand, returned at exit):\n  \
        ctl-host$    rackmem control --listen 0.0.0.0:7080 --store sqlite:/var/lib/rackmem/control.db\n  \
        memory-rich$ rackmem brick --listen tcp://0.0.0.0:7070 --size 64GiB --control http://ctl-host:7080\n  \
        compute$     rackmem agent --control http://ctl-host:7080 &\n  \
        compute$     rackmem run --agent /run/rackmem/agent.sock --local 25% -- ./app"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with its large allocations on remote memory (like numactl).
    Run(run_cmd::RunArgs),
    /// Serve this machine's idle memory as a memory brick.
    Brick(brick_cmd::BrickArgs),
    /// Measure: floors, remote fault latency, workloads against native runs.
    Bench(bench_cmd::BenchArgs),
    /// Serve the control plane: bricks register with it, it allocates segments to nodes.
    Control(control_cmd::ControlArgs),
    /// Look at and change the control plane's state (bricks, nodes, allocations, graph).
    Ctl(ctl_cmd::CtlArgs),
    /// Run the node agent: hands memory from the control plane to this machine's programs.
    Agent(agent_cmd::AgentArgs),
    /// Watch the rack: bricks and the programs on agent memory, refreshing (like top).
    Top(top_cmd::TopArgs),
    /// Explain and predict: remote faults and streams over other networks (the link model).
    Model(model_cmd::ModelArgs),
    /// Move a range of a running program's memory to the local buffer or another brick.
    Migrate(migrate_cmd::MigrateArgs),
}

fn main() {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Brick(_) | Command::Control(_) | Command::Agent(_)) {
        use std::io::IsTerminal;
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .init();
    }
    let result = match cli.command {
        Command::Run(args) => run_cmd::run(args),
        Command::Brick(args) => brick_cmd::run(args),
        Command::Bench(args) => bench_cmd::run_bench(args),
        Command::Control(args) => control_cmd::run(args),
        Command::Ctl(args) => ctl_cmd::run(args),
        Command::Agent(args) => agent_cmd::run(args),
        Command::Top(args) => top_cmd::run(args),
        Command::Model(args) => model_cmd::run(args),
        Command::Migrate(args) => migrate_cmd::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("rackmem: error: {e:#}");
            let code = if e.downcast_ref::<run_cmd::Unreachable>().is_some() {
                exit::BRICK_UNREACHABLE
            } else if e.downcast_ref::<run_cmd::NoPermission>().is_some() {
                exit::NO_PERMISSION
            } else {
                exit::SOFTWARE
            };
            std::process::exit(code)
        }
    }
}
