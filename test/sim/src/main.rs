//! `etcdadm-sim`: run the local management plane, the demo, or a bare API server.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use etcdadm_sim::boot_delay::BootDelay;
use etcdadm_sim::demo::{self, ApiServerChoice, DemoOptions};
use etcdadm_sim::plane::Machines;

#[derive(Parser)]
#[command(
    name = "etcdadm-sim",
    version,
    about = "Local management plane with real etcd machines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CRDs the sim API server defines itself (CAPI Cluster/Machine/KCP stand-ins and
    /// the Sim infrastructure kinds) as a JSON List, to `kubectl apply -f -` on a real API server
    /// before `demo --kubeconfig` (this repository's own CRDs are in config/crd/bases).
    Crds,
    /// Measure: create-to-Ready split into etcd start and controller overhead, or the managers'
    /// idle footprint. Prints figures for BENCHMARKS.md.
    Bench {
        #[command(subcommand)]
        bench: Bench,
        /// Working directory for the planes the bench starts.
        #[arg(long, default_value = "out/bench", global = true)]
        work_dir: PathBuf,
    },
    /// Bring up an API server (a real kube-apiserver when one is installed), both controllers and
    /// N process machines forming one etcd cluster through etcdadm init and learner joins; stay
    /// up until Ctrl-C.
    Demo {
        #[arg(long, default_value_t = 3)]
        members: usize,
        /// Working directory (machine roots, logs, kubeconfig).
        #[arg(long, default_value = "out/sim")]
        work_dir: PathBuf,
        /// etcd version for `cloudInitConfig.version` (must be installed locally).
        #[arg(long)]
        etcd_version: Option<String>,
        #[arg(long, default_value_t = 180)]
        timeout_seconds: u64,
        /// Exit once the cluster is ready instead of running until Ctrl-C.
        #[arg(long)]
        exit_when_ready: bool,
        /// Which API server to start: `auto` starts a real kube-apiserver when one is found the
        /// envtest way ($KUBEBUILDER_ASSETS/kube-apiserver, else target/envtest/kube-apiserver,
        /// which .ci/setup installs) and the in-memory one otherwise.
        #[arg(long, value_enum, default_value_t = ApiServerChoice::Auto)]
        api_server: ApiServerChoice,
        /// Use the running API server of this kubeconfig (config/crd/bases and `etcdadm-sim crds`
        /// applied) instead of starting one.
        #[arg(long, conflicts_with = "api_server")]
        kubeconfig: Option<PathBuf>,
        /// Boot machines with this command instead of local processes:
        /// `CMD boot|stop|fault <kind> --name N --ip IP --user-data FILE --root DIR`.
        #[arg(long, value_name = "CMD")]
        machine_runtime: Option<String>,
        /// What the machines run: the etcdadm stand-in on loopback addresses, or the real
        /// etcdadm, each machine in a network namespace on a bridge (10.213.1.0/24; needs what
        /// `.ci/setup` puts under target/).
        #[arg(long, value_enum, default_value_t = MachineKind::StandIn)]
        machines: MachineKind,
        /// How long each Machine takes to boot once its bootstrap data exists, as slow
        /// infrastructure would: `30s`, or a range `20s-40s` drawn per Machine from
        /// `--boot-seed` (raise --timeout-seconds to match).
        #[arg(long, default_value = "0s")]
        boot_delay: String,
        #[arg(long, default_value_t = 1)]
        boot_seed: u64,
    },
}

/// `--machines`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum MachineKind {
    StandIn,
    RealEtcdadm,
}

#[derive(Subcommand)]
enum Bench {
    /// create-to-Ready for each size, `--runs` times each.
    Create {
        #[arg(long, value_delimiter = ',', default_value = "1,3,5")]
        sizes: Vec<i32>,
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// One etcdadm-controller keeping N established 3-member clusters (fake etcd members on
    /// loopback, real TLS) healthy: adoption, achieved interval, CPU, RSS and API requests, then
    /// a cold takeover by a new process (and with --failover a leader failover).
    Scale {
        #[arg(long, default_value_t = 100)]
        clusters: usize,
        #[arg(long, default_value_t = 60)]
        window_seconds: u64,
        /// How long after the last cluster turned Ready the steady window begins.
        #[arg(long, default_value_t = 20)]
        settle_seconds: u64,
        /// The controller's `--concurrency` (its own default when absent).
        #[arg(long)]
        concurrency: Option<u16>,
        /// Also run etcdadm-bootstrap over every member's EtcdadmConfig.
        #[arg(long)]
        bootstrap: bool,
        /// After the takeover, run two controller replicas electing a leader and kill the leader.
        #[arg(long)]
        failover: bool,
    },
    /// create-to-Ready on the etcdadm stand-in and on the real etcdadm, one after the other,
    /// with each join split into its steps.
    Steps {
        #[arg(long, default_value_t = 3)]
        members: i32,
        #[arg(long, default_value_t = 1)]
        runs: usize,
    },
    /// Time to Ready on Machines that take `--boot-delay` to boot: creations of each size and a
    /// scale-up, one Machine at a time (`parallelMachines: 1`) and booting ahead (the default).
    Boot {
        /// How long each Machine takes to get its address and run its user data once its
        /// bootstrap data exists: `30s`, or a range `20s-40s` drawn per Machine from
        /// `--boot-seed`.
        #[arg(long, default_value = "30s")]
        boot_delay: String,
        #[arg(long, default_value_t = 1)]
        boot_seed: u64,
        #[arg(long, value_delimiter = ',', default_value = "3,5")]
        sizes: Vec<i32>,
        /// A scale-up to time too, `FROM:TO` (e.g. `3:5`).
        #[arg(long)]
        scale_up: Option<String>,
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// Only `boot-ahead` or only `one-at-a-time` (both when absent).
        #[arg(long)]
        only: Option<String>,
    },
    /// The longest client write gap across a 3-member rolling replacement, `--runs` times,
    /// `--parallel` planes at once (the test suite runs four scenarios at a time).
    Rollout {
        #[arg(long, default_value_t = 20)]
        runs: usize,
        #[arg(long, default_value_t = 4)]
        parallel: usize,
        /// Rotate the etcd CA (the `rotate-ca` annotation: three rolls) instead of changing
        /// `etcdSettings` (one roll); the writer holds an identity from each CA.
        #[arg(long)]
        ca_rotation: bool,
    },
    /// What continuous backup's recorders cost: N of them, each on its own connection, watch
    /// one real member while a client writes, uploading deltas into SeaweedFS.
    Continuous {
        #[arg(long, default_value_t = 100)]
        recorders: usize,
        #[arg(long, default_value_t = 20)]
        writes_per_second: u32,
        #[arg(long, default_value_t = 20)]
        interval_seconds: u64,
        #[arg(long, default_value_t = 60)]
        window_seconds: u64,
    },
    /// How long a restore from continuous backup takes: a full snapshot of `--megabytes` MiB
    /// plus `--events` writes after it as deltas, restored `--runs` times to the latest delta
    /// (creation → Ready, split into phases) and once from the snapshot alone; each restored
    /// cluster's keys are checked against the source's.
    Restore {
        #[arg(long, default_value_t = 100)]
        megabytes: u64,
        #[arg(long, default_value_t = 10_000)]
        events: u64,
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// RSS and CPU of both managers over one minute with N idle EtcdadmClusters.
    Idle {
        #[arg(long, default_value_t = 0)]
        clusters: usize,
    },
}

/// `FROM:TO`, two member counts.
fn parse_change(text: &str) -> Result<(i32, i32), String> {
    let (from, to) = text
        .split_once(':')
        .ok_or_else(|| format!("--scale-up {text:?}: expected FROM:TO, e.g. 3:5"))?;
    let count = |n: &str| {
        n.trim()
            .parse::<i32>()
            .map_err(|e| format!("--scale-up {text:?}: {n:?} is not a member count: {e}"))
    };
    Ok((count(from)?, count(to)?))
}

#[tokio::main]
async fn main() -> ExitCode {
    // One arm per subcommand, each a call: the command line read at once.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let result = match Cli::parse().command {
        Command::Bench { bench, work_dir } => {
            let work_dir = std::path::absolute(&work_dir).unwrap_or(work_dir);
            match bench {
                Bench::Create { sizes, runs } => {
                    etcdadm_sim::bench::run_create(&work_dir, &sizes, runs).await
                }
                Bench::Steps { members, runs } => {
                    etcdadm_sim::bench_steps::run_steps(&work_dir, members, runs).await
                }
                Bench::Scale {
                    clusters,
                    window_seconds,
                    settle_seconds,
                    concurrency,
                    bootstrap,
                    failover,
                } => {
                    let options = etcdadm_sim::bench_scale::ScaleOptions {
                        clusters,
                        window: Duration::from_secs(window_seconds),
                        settle: Duration::from_secs(settle_seconds),
                        concurrency,
                        bootstrap,
                        failover,
                    };
                    etcdadm_sim::bench_scale::run_scale(&work_dir.join("scale"), &options).await
                }
                Bench::Boot {
                    boot_delay,
                    boot_seed,
                    sizes,
                    scale_up,
                    runs,
                    only,
                } => match (
                    BootDelay::parse(&boot_delay, boot_seed),
                    scale_up.as_deref().map(parse_change).transpose(),
                    only.as_deref().map(str::parse).transpose(),
                ) {
                    (Ok(delay), Ok(scale), Ok(only)) => {
                        let options = etcdadm_sim::bench_boot::BootOptions {
                            delay,
                            sizes,
                            scale,
                            runs,
                            only,
                        };
                        etcdadm_sim::bench_boot::run_boot(&work_dir, &options).await
                    }
                    (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                        Err(etcdadm_sim::error::SimError::Setup(e))
                    }
                },
                Bench::Rollout {
                    runs,
                    parallel,
                    ca_rotation,
                } => {
                    let change = if ca_rotation {
                        etcdadm_sim::bench_rollout::Change::CaRotation
                    } else {
                        etcdadm_sim::bench_rollout::Change::Settings
                    };
                    etcdadm_sim::bench_rollout::run_rollout(&work_dir, runs, parallel, change).await
                }
                Bench::Continuous {
                    recorders,
                    writes_per_second,
                    interval_seconds,
                    window_seconds,
                } => {
                    etcdadm_sim::bench_continuous::run_continuous(
                        etcdadm_sim::bench_continuous::ContinuousOptions {
                            recorders,
                            writes_per_second,
                            interval: Duration::from_secs(interval_seconds),
                            window: Duration::from_secs(window_seconds),
                        },
                    )
                    .await
                }
                Bench::Restore {
                    megabytes,
                    events,
                    runs,
                } => {
                    let options = etcdadm_sim::bench_restore::RestoreOptions {
                        megabytes,
                        events,
                        runs,
                    };
                    etcdadm_sim::bench_restore::run_restore(&work_dir.join("restore"), &options).await
                }
                Bench::Idle { clusters } => {
                    etcdadm_sim::bench::run_idle(&work_dir.join("idle"), clusters, Duration::from_secs(20))
                        .await
                }
            }
        }
        Command::Crds => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List",
                                          "items": etcdadm_sim_apiserver::shipped_crds()});
            serde_json::to_string_pretty(&list)
                .map(|text| println!("{text}"))
                .map_err(Into::into)
        }
        Command::Demo {
            members,
            work_dir,
            etcd_version,
            timeout_seconds,
            exit_when_ready,
            api_server,
            kubeconfig,
            machine_runtime,
            machines,
            boot_delay,
            boot_seed,
        } => {
            let work_dir = std::path::absolute(&work_dir).unwrap_or(work_dir);
            let boot_delay = match BootDelay::parse(&boot_delay, boot_seed) {
                Ok(delay) => delay,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let machines = match machines {
                MachineKind::StandIn => Machines::StandIn,
                MachineKind::RealEtcdadm => Machines::RealEtcdadm { lab: demo::DEMO_LAB },
            };
            demo::run(DemoOptions {
                members,
                work_dir,
                etcd_version,
                timeout: Duration::from_secs(timeout_seconds),
                exit_when_ready,
                api_server,
                kubeconfig,
                machine_runtime,
                machines,
                boot_delay,
                ..DemoOptions::default()
            })
            .await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
