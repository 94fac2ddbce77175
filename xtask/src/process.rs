//! Running external commands with their command line shown and failures
//! explained.

use std::{
    ffi::OsStr,
    path::Path,
    process::{Command, Output},
};

use anyhow::{Context, Result, bail};

/// Prints a progress heading.
pub fn step(what: &str) {
    println!("==> {what}");
}

/// A command to run, echoed before it runs.
pub struct Run {
    command: Command,
}

impl Run {
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Self {
            command: Command::new(program),
        }
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command.args(args);
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.command.env(key, value);
        self
    }

    pub fn current_dir(mut self, dir: &Path) -> Self {
        self.command.current_dir(dir);
        self
    }

    fn describe(&self) -> String {
        let mut line = self.command.get_program().to_string_lossy().into_owned();
        for arg in self.command.get_args() {
            line.push(' ');
            line.push_str(&arg.to_string_lossy());
        }
        line
    }

    /// Runs with inherited output; fails unless the exit status is success.
    pub fn run(mut self) -> Result<()> {
        let line = self.describe();
        println!("    $ {line}");
        let status = self
            .command
            .status()
            .with_context(|| format!("could not start `{line}`"))?;
        if !status.success() {
            bail!("`{line}` failed ({status})");
        }
        Ok(())
    }

    /// Runs with captured output; fails unless the exit status is success.
    pub fn output(mut self) -> Result<Output> {
        let line = self.describe();
        let output = self
            .command
            .output()
            .with_context(|| format!("could not start `{line}`"))?;
        if !output.status.success() {
            bail!(
                "`{line}` failed ({}):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(output)
    }

    /// Runs with captured output and returns stdout as text.
    pub fn stdout(self) -> Result<String> {
        let output = self.output()?;
        String::from_utf8(output.stdout).context("command printed non-UTF-8 text")
    }
}

/// `cargo` (the one running this xtask) in the workspace.
pub fn cargo(workspace: &Path, args: &[&str]) -> Run {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    Run::new(cargo).args(args).current_dir(workspace)
}
