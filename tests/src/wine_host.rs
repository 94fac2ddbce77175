//! A private Wine 8 prefix hosting the real kstack.sys, driven through Wine's
//! own `sc.exe` and the real client. Used by the end-to-end tests and by
//! `cargo xtask demo`. Facts it relies on are in `../shared/PLATFORM-NOTES.md`.

use std::{
    env,
    fmt::Write as _,
    fs::{self, File},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    thread,
    time::Duration,
};

/// The service name kstack is installed as.
pub const SERVICE: &str = kstack_abi::SERVICE_NAME;
/// The do-nothing driver in the Wine support folder (`tests/wine/probe_driver.c`),
/// whose load the module-record test watches.
pub const PROBE_DRIVER: &str = "kstack-probe.sys";
/// The test programs in the Wine support folder, installed beside the
/// client (built from `tests/ioctl-storm/`).
pub const TEST_PROGRAMS: [&str; 4] = [
    "kstack-ioctl-storm.exe",
    "kstack-inject.exe",
    "kstack-drain-bench.exe",
    "kstack-order-check.exe",
];
/// The folder, inside the Wine support folder, of the kstack.sys built with
/// the `test-injection` feature (never packaged).
pub const INJECTION_DRIVER_DIR: &str = "injection";

/// Where the driver lives inside the prefix.
const DRIVER_WINDOWS_PATH: &str = r"C:\windows\system32\drivers\kstack.sys";
/// The registry key holding `DisablePagingExecutive`.
const MEMORY_MANAGEMENT_KEY: &str =
    r"HKLM\SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management";
/// The service's `Parameters` key (ring capacity).
const PARAMETERS_KEY: &str = r"HKLM\SYSTEM\CurrentControlSet\Services\kstack\Parameters";
/// The value the driver writes under `Parameters` at unload.
const UNLOAD_RECORD: &str = "LastUnloadPoolAllocations";
/// Win32 `ERROR_SERVICE_DATABASE_LOCKED`: services.exe is still starting.
const DATABASE_LOCKED: &str = "1055";

/// A failed step, with what was run and what it said.
pub type WineResult<T> = Result<T, String>;

/// The prefix and where the client lives in it.
pub struct WineHost {
    prefix: PathBuf,
    client_dir: PathBuf,
}

impl WineHost {
    /// Makes a fresh prefix at `prefix` (removing an old one), keeps its
    /// wineserver alive, installs `kstack.sys` and the client (with the
    /// `bcryptprimitives.dll` shim from `wine_support`), and creates the
    /// service. The driver is not started.
    ///
    /// # Errors
    /// Any step that fails, with its output.
    pub fn create(prefix: &Path, package: &Path, wine_support: &Path) -> WineResult<Self> {
        if prefix.exists() {
            // An earlier run's wineserver may still hold the old prefix.
            let _ = Command::new("wineserver")
                .arg("-k")
                .env("WINEPREFIX", prefix)
                .status();
            fs::remove_dir_all(prefix)
                .map_err(|error| format!("removing {}: {error}", prefix.display()))?;
        }
        fs::create_dir_all(prefix)
            .map_err(|error| format!("creating {}: {error}", prefix.display()))?;
        let host = Self {
            prefix: prefix.to_path_buf(),
            client_dir: prefix.join("drive_c/kstack"),
        };
        // While wineboot first sets up a prefix, two services.exe run for a
        // few seconds, and a service created then lands in one of them only
        // (seen with Wine 8): let that server end before anything else.
        host.run_detached(host.command("wine").args(["wineboot", "-i"]))?;
        host.run_detached(host.command("wineserver").arg("-w"))?;
        host.boot()?;
        fs::create_dir_all(&host.client_dir)
            .map_err(|error| format!("creating the client folder: {error}"))?;
        host.install_driver_image(package)?;
        copy(
            &package.join("kstack.exe"),
            &host.client_dir.join("kstack.exe"),
        )?;
        for program in TEST_PROGRAMS {
            copy(&wine_support.join(program), &host.client_dir.join(program))?;
        }
        copy(
            &wine_support.join("bcryptprimitives.dll"),
            &host.client_dir.join("bcryptprimitives.dll"),
        )?;
        host.create_service()?;
        Ok(host)
    }

    /// Starts the prefix's wineserver and services.exe.
    fn boot(&self) -> WineResult<()> {
        // Persistent: otherwise wineserver exits with its last client and
        // takes winedevice.exe, the driver's host process, with it.
        self.run_detached(self.command("wineserver").arg("-p"))?;
        // Start services.exe now, with no output of ours to inherit.
        self.run_detached(self.command("wine").arg("wineboot"))
    }

    /// The prefix's reboot: stops the driver, ends the wineserver (which
    /// saves the registry, write times included) and starts a new one, whose
    /// start time is the boot time the driver sees
    /// (`SystemTimeOfDayInformation`). The driver is not started.
    ///
    /// # Errors
    /// Any step that fails, with its output.
    pub fn reboot(&self) -> WineResult<()> {
        if self.driver_running() {
            self.stop_driver()?;
        }
        self.run_detached(self.command("wineserver").arg("-k"))?;
        self.run_detached(self.command("wineserver").arg("-w"))?;
        // Registry write times and the boot time are 100 ns apart at least;
        // a whole second makes "written before boot" plain in any log.
        thread::sleep(Duration::from_secs(1));
        self.boot()
    }

    /// Copies `dir`'s kstack.sys to where the service loads it from; the
    /// next start loads it. The driver must be stopped.
    ///
    /// # Errors
    /// When the copy fails.
    pub fn install_driver_image(&self, dir: &Path) -> WineResult<()> {
        let drivers = self.prefix.join("drive_c/windows/system32/drivers");
        copy(&dir.join("kstack.sys"), &drivers.join("kstack.sys"))
    }

    /// A command run in this prefix, quietly.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .env("WINEPREFIX", &self.prefix)
            .env("WINEDEBUG", "-all")
            .env_remove("DISPLAY")
            // Wine passes the environment on; a symbol path set in the
            // developer's shell would change how the client names frames.
            .env_remove("_NT_SYMBOL_PATH");
        command
    }

    /// Runs a command that leaves processes behind (wineserver, services):
    /// with no pipes for them to inherit, so waiting for it cannot hang.
    fn run_detached(&self, command: &mut Command) -> WineResult<()> {
        let status = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|error| format!("cannot run {command:?}: {error}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "{command:?} failed ({status}) in {}",
                self.prefix.display()
            ))
        }
    }

    /// `sc.exe` with these arguments.
    ///
    /// # Errors
    /// When sc fails.
    pub fn sc(&self, args: &[&str]) -> WineResult<String> {
        let command = || {
            let mut command = self.command("wine");
            // Wine's sc reports the Win32 error code only on its err
            // channel, so a real failure is never silent.
            command.env("WINEDEBUG", "-all,err+sc").arg("sc").args(args);
            command
        };
        let output = Self::started("sc", args, command)?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(describe(&command(), &output))
        }
    }

    /// `sc create kstack type= kernel binPath= ...`.
    ///
    /// # Errors
    /// When sc fails.
    pub fn create_service(&self) -> WineResult<()> {
        self.create_service_in(None)
    }

    /// `sc create kstack ...` in a load-order group: drivers of one group
    /// share one winedevice.exe host (Wine's `sc config` cannot change a
    /// service's group).
    ///
    /// # Errors
    /// When sc fails.
    pub fn create_service_in(&self, group: Option<&str>) -> WineResult<()> {
        self.create_kernel_service(SERVICE, DRIVER_WINDOWS_PATH, group)
    }

    /// `sc create NAME type= kernel start= demand [group= GROUP] binPath=
    /// BINARY`: a demand-start kernel driver service.
    ///
    /// # Errors
    /// When sc fails.
    pub fn create_kernel_service(
        &self,
        name: &str,
        binary: &str,
        group: Option<&str>,
    ) -> WineResult<()> {
        let mut args = vec!["create", name, "type=", "kernel", "start=", "demand"];
        if let Some(group) = group {
            args.extend(["group=", group]);
        }
        args.extend(["binPath=", binary]);
        self.sc(&args).map(drop)
    }

    /// `sc delete kstack`.
    ///
    /// # Errors
    /// When sc fails.
    pub fn delete_service(&self) -> WineResult<()> {
        self.sc(&["delete", SERVICE]).map(drop)
    }

    /// Starts the driver; waits out services.exe still starting after
    /// wineboot (error 1055), then expects the service to run.
    ///
    /// # Errors
    /// When the service does not reach RUNNING.
    pub fn start_driver(&self) -> WineResult<()> {
        let mut attempts = 0;
        loop {
            match self.sc(&["start", SERVICE]) {
                Ok(_) => break,
                Err(error) if error.contains(DATABASE_LOCKED) && attempts < 40 => {
                    attempts += 1;
                    thread::sleep(Duration::from_millis(250));
                }
                Err(error) => return Err(error),
            }
        }
        self.expect_state("RUNNING")
    }

    /// Stops the driver (its `DriverUnload` runs) and expects STOPPED.
    ///
    /// # Errors
    /// When the service does not stop.
    pub fn stop_driver(&self) -> WineResult<()> {
        self.sc(&["stop", SERVICE])?;
        self.expect_state("STOPPED")
    }

    fn expect_state(&self, state: &str) -> WineResult<()> {
        let query = self.sc(&["query", SERVICE])?;
        if query.contains(state) {
            Ok(())
        } else {
            Err(format!(
                "expected the service {state}, sc query says:\n{query}"
            ))
        }
    }

    /// Whether the driver is running now.
    #[must_use]
    pub fn driver_running(&self) -> bool {
        self.sc(&["query", SERVICE])
            .is_ok_and(|query| query.contains("RUNNING"))
    }

    /// Runs the real client with `args`; the output is whatever it printed
    /// and its exit status.
    ///
    /// # Errors
    /// Only when Wine cannot be started at all.
    pub fn client(&self, args: &[&str]) -> WineResult<Output> {
        self.program("kstack.exe", args)
    }

    /// Starts the real client with `args` in the background, its output
    /// discarded: for a test that signals it mid-run. The child is the
    /// client's process (Wine's loader becomes the program).
    ///
    /// # Errors
    /// When Wine cannot be started.
    pub fn spawn_client(&self, args: &[&str]) -> WineResult<std::process::Child> {
        self.program_command("kstack.exe", args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| format!("starting kstack {}: {error}", args.join(" ")))
    }

    /// Runs the real client with `args` and one more environment variable.
    ///
    /// # Errors
    /// Only when Wine cannot be started at all.
    pub fn client_with_env(
        &self,
        (name, value): (&str, &str),
        args: &[&str],
    ) -> WineResult<Output> {
        self.run_program("kstack.exe", args, Some((name, value)))
    }

    /// The client's folder and working directory: relative file names the
    /// client writes land here.
    #[must_use]
    pub fn client_dir(&self) -> &Path {
        &self.client_dir
    }

    /// The prefix's `C:\`.
    #[must_use]
    pub fn drive_c(&self) -> PathBuf {
        self.prefix.join("drive_c")
    }

    /// Runs one of the programs installed beside the client.
    ///
    /// # Errors
    /// Only when Wine cannot be started at all.
    pub fn program(&self, name: &str, args: &[&str]) -> WineResult<Output> {
        self.run_program(name, args, None)
    }

    /// Runs a program with one more environment variable. Seen once in a
    /// loaded CI run: `wine` exited 1 and printed nothing (its own errors
    /// are off), so the program never ran; none of ours, nor Wine's `sc`
    /// with its err channel on, exits 1 without saying why. Then it runs
    /// once more, with Wine's errors shown.
    fn run_program(
        &self,
        name: &str,
        args: &[&str],
        variable: Option<(&str, &str)>,
    ) -> WineResult<Output> {
        let command = || {
            let mut command = self.program_command(name, args);
            if let Some((key, value)) = variable {
                command.env(key, value);
            }
            command
        };
        Self::started(name, args, command)
    }

    /// Runs `command()`, and once more, with Wine's errors shown, when Wine
    /// did not start the program (see [`Self::run_program`]).
    fn started(name: &str, args: &[&str], command: impl Fn() -> Command) -> WineResult<Output> {
        let output = capture(&mut command())?;
        if !Self::not_started(&output) {
            return Ok(output);
        }
        eprintln!("wine did not start {name} {args:?} (exit 1 before it ran); retrying once");
        capture(command().env("WINEDEBUG", "-all,err+all"))
    }

    /// Whether `wine` failed before the program ran: exit 1 with no output,
    /// or with the launcher's own complaint (seen once in 100 `sc stop`s
    /// right after a prefix reboot, 2026-11-24: "Application could not be
    /// started, ..." then "`ShellExecuteEx` failed").
    fn not_started(output: &Output) -> bool {
        output.status.code() == Some(1)
            && output.stderr.is_empty()
            && (output.stdout.is_empty()
                || output
                    .stdout
                    .starts_with(b"Application could not be started"))
    }

    fn program_command(&self, name: &str, args: &[&str]) -> Command {
        let mut command = self.command("wine");
        command
            .arg(self.client_dir.join(name))
            .args(args)
            .current_dir(&self.client_dir);
        command
    }

    /// Runs the client and requires success; returns its standard output.
    ///
    /// # Errors
    /// A failing client, with everything it printed.
    pub fn client_ok(&self, args: &[&str]) -> WineResult<String> {
        let output = self.client(args)?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            let mut message = format!("kstack {} failed ({})", args.join(" "), output.status);
            let _ = write!(
                message,
                "\nstdout:\n{}\nstderr:\n{}",
                lossy(&output.stdout),
                lossy(&output.stderr)
            );
            Err(message)
        }
    }

    /// Sets `DisablePagingExecutive` (or removes it). The driver reads it at
    /// load and takes it as in effect only when its key was written before
    /// this boot ([`Self::reboot`]) or the override says so
    /// ([`Self::set_assume_paging_executive_in_effect`]).
    ///
    /// # Errors
    /// When reg fails.
    pub fn set_disable_paging_executive(&self, value: Option<u32>) -> WineResult<()> {
        self.set_dword(MEMORY_MANAGEMENT_KEY, "DisablePagingExecutive", value)
    }

    /// Sets the service's `Parameters\AssumePagingExecutiveInEffect` (or
    /// removes it); read at load.
    ///
    /// # Errors
    /// When reg fails.
    pub fn set_assume_paging_executive_in_effect(&self, value: Option<u32>) -> WineResult<()> {
        self.set_dword(
            PARAMETERS_KEY,
            kstack_abi::paging::ASSUME_IN_EFFECT_VALUE,
            value,
        )
    }

    /// Sets `DisablePagingExecutive`=1 and says it is in effect with the
    /// override, as a test machine's owner would after rebooting: the
    /// driver then walks at `DISPATCH_LEVEL` (the timer source) from its
    /// next start.
    ///
    /// # Errors
    /// When reg fails.
    pub fn allow_elevated_walks(&self) -> WineResult<()> {
        self.set_disable_paging_executive(Some(1))?;
        self.set_assume_paging_executive_in_effect(Some(1))
    }

    /// Sets the service's `Parameters\RingCapacity`, in KiB (or removes
    /// it); read at load.
    ///
    /// # Errors
    /// When reg fails.
    pub fn set_ring_capacity(&self, kib: Option<u32>) -> WineResult<()> {
        self.set_dword(PARAMETERS_KEY, "RingCapacity", kib)
    }

    /// Sets the service's `Parameters\StackTableEntries` (or removes it:
    /// the default table); read at load.
    ///
    /// # Errors
    /// When reg fails.
    pub fn set_stack_table_entries(&self, entries: Option<u32>) -> WineResult<()> {
        self.set_dword(
            PARAMETERS_KEY,
            kstack_abi::STACK_TABLE_ENTRIES_VALUE,
            entries,
        )
    }

    /// What the driver recorded at its last unload: the pool allocations it
    /// still held after freeing everything (`None` when there is no record).
    ///
    /// # Errors
    /// When the recorded value cannot be read.
    pub fn last_unload_pool_allocations(&self) -> WineResult<Option<u32>> {
        let output = self.reg(&["query", PARAMETERS_KEY, "/v", UNLOAD_RECORD])?;
        if !output.status.success() {
            return Ok(None);
        }
        let text = lossy(&output.stdout);
        let value = text
            .lines()
            .find(|line| line.contains(UNLOAD_RECORD))
            .and_then(|line| line.split_whitespace().last())
            .and_then(|hex| u32::from_str_radix(hex.trim_start_matches("0x"), 16).ok())
            .ok_or_else(|| format!("unexpected reg query output:\n{text}"))?;
        Ok(Some(value))
    }

    /// Removes the unload record, so the next unload's is fresh.
    ///
    /// # Errors
    /// When reg fails.
    pub fn forget_unload_record(&self) -> WineResult<()> {
        self.set_dword(PARAMETERS_KEY, UNLOAD_RECORD, None)
    }

    fn set_dword(&self, key: &str, name: &str, value: Option<u32>) -> WineResult<()> {
        let value_text = value.map(|value| value.to_string());
        let args = match &value_text {
            Some(text) => vec!["add", key, "/v", name, "/t", "REG_DWORD", "/d", text, "/f"],
            None => vec!["delete", key, "/v", name, "/f"],
        };
        let output = self.reg(&args)?;
        // Deleting a value that is not there is fine.
        if output.status.success() || value.is_none() {
            Ok(())
        } else {
            Err(describe(&self.reg_command(&args), &output))
        }
    }

    /// Wine's `reg.exe` with these arguments, started again when Wine did
    /// not start it (seen in CI right after a prefix reboot, 2026-11-25:
    /// "Application could not be started", as for `sc` in
    /// [`Self::not_started`]).
    fn reg(&self, args: &[&str]) -> WineResult<Output> {
        Self::started("reg", args, || self.reg_command(args))
    }

    fn reg_command(&self, args: &[&str]) -> Command {
        let mut command = self.command("wine");
        command.arg("reg").args(args);
        command
    }

    /// Stops the driver if it runs and ends this prefix's wineserver (and
    /// with it winedevice.exe).
    pub fn shut_down(&self) {
        if self.driver_running() {
            let _ = self.stop_driver();
        }
        let _ = self.run_detached(self.command("wineserver").arg("-k"));
    }
}

/// Runs `command` with its output going to files, not pipes: a Wine process
/// may start long-lived ones (services.exe, winedevice.exe) that inherit its
/// output and keep a pipe open forever.
fn capture(command: &mut Command) -> WineResult<Output> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let stem = env::temp_dir().join(format!(
        "kstack-wine-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let (out_path, err_path) = (stem.with_extension("out"), stem.with_extension("err"));
    let file = |path: &Path| {
        File::create(path).map_err(|error| format!("creating {}: {error}", path.display()))
    };
    let status = command
        .stdin(Stdio::null())
        .stdout(file(&out_path)?)
        .stderr(file(&err_path)?)
        .status()
        .map_err(|error| format!("cannot run {command:?}: {error}"));
    let read = |path: &Path| fs::read(path).unwrap_or_default();
    let output = status.map(|status| Output {
        status,
        stdout: read(&out_path),
        stderr: read(&err_path),
    });
    let _ = fs::remove_file(&out_path);
    let _ = fs::remove_file(&err_path);
    output
}

fn copy(from: &Path, to: &Path) -> WineResult<()> {
    fs::copy(from, to)
        .map(drop)
        .map_err(|error| format!("copying {} to {}: {error}", from.display(), to.display()))
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn describe(command: &Command, output: &Output) -> String {
    format!(
        "{command:?} failed ({})\nstdout:\n{}\nstderr:\n{}",
        output.status,
        lossy(&output.stdout),
        lossy(&output.stderr)
    )
}
