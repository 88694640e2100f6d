//! `rumus launch -n N FILE [run options]`: `rumus run FILE [run options]` on N ranks, by
//! replacing this process with `mpirun -np N <this binary> run ...`. The binary must be built
//! with the feature `mpi` (ranks of a binary without it would each train alone), and `mpirun`
//! must be on the `PATH` (Debian: `openmpi-bin`); either missing is a usage error that says so.

use crate::{err, Result};
use std::process::Command;

/// Most ranks `-n` accepts.
pub const MAX_RANKS: u64 = 4096;

/// Start `n` ranks of `rumus run FILE ARGS...` under `mpirun`; returns only on an error (or,
/// where processes cannot be replaced, with `mpirun`'s exit code).
pub fn launch(n: u64, file: &str, args: &[String]) -> Result<i32> {
    if !crate::dist::MPI_BUILT {
        return Err(err!(
            Usage,
            "this rumus was built without the `mpi` feature; build it with \
             `cargo build --release --features mpi` to launch ranks"
        ));
    }
    let exe = std::env::current_exe()
        .map_err(|e| err!(Io, "cannot find the rumus binary to launch: {e}"))?;
    let mut cmd = Command::new("mpirun");
    cmd.arg("-np").arg(n.to_string()).arg(exe).arg("run").arg(file).args(args);
    let not_found = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => err!(
            Usage,
            "mpirun is not installed (Debian: apt-get install openmpi-bin); `rumus launch` \
             starts its ranks through it"
        ),
        _ => err!(Io, "cannot start mpirun: {e}"),
    };
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        Err(not_found(cmd.exec()))
    }
    #[cfg(not(unix))]
    {
        let status = cmd.status().map_err(not_found)?;
        Ok(status.code().unwrap_or(1))
    }
}
