//! `etcdadm-bootstrap`: the bootstrap provider's binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use etcdadm_bootstrap::render::cli::RenderArgs;

#[derive(Parser)]
#[command(
    name = "etcdadm-bootstrap",
    version,
    about = "Cluster API bootstrap provider for etcdadm"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the EtcdadmConfig controller against the cluster from the kubeconfig or in-cluster config.
    Run {
        /// Watch only this namespace (all namespaces when absent).
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Print the CRDs this provider serves, or write them into a directory.
    Crd {
        /// Write one `<group>_<plural>.yaml` per CRD here instead of printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Print the user data a machine would get for an EtcdadmConfig file, a CA and init or join.
    Render(RenderArgs),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run { namespace } => match run(namespace) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Crd { out_dir } => {
            match etcdadm_shared::crd::emit(&etcdadm_bootstrap::crds(), out_dir.as_deref()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Render(args) => match etcdadm_bootstrap::render::cli::run(&args) {
            Ok(user_data) => {
                print!("{user_data}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Run the controller until SIGINT or SIGTERM.
fn run(namespace: Option<String>) -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let client = kube::Client::try_default().await?;
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        };
        etcdadm_bootstrap::controller::run(client, namespace, shutdown).await;
        Ok(())
    })
}
