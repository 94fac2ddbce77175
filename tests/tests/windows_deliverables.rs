//! Checks of the Windows deliverables that a host without Windows can make.
//! None of them runs anything on Windows; each says what it does check:
//!
//! - `inf/kstack.inx`, and the stamped `kstack.inf` in the package folder,
//!   read with `kstack_tests::inf`: a primitive-driver INF that installs the
//!   service, binary, start type and `Parameters\RingCapacity` the driver
//!   expects, every expected value taken from kstack-abi and
//!   kstack-driver-core. (`InfVerif` itself needs the WDK: the Windows CI
//!   job runs it through `cargo make`.)
//! - `Makefile.toml`: the Windows flow's tasks exist and refer only to
//!   tasks it defines or wdk-build 0.6.0's, it lays out and stamps
//!   `inf/kstack.inx`, and `DriverVer`'s version is the workspace version.
//! - `.github/workflows/ci.yml`: the YAML parses, has the Linux and Windows
//!   jobs, and the Windows job's PowerShell steps parse.
//! - `scripts/windows`: every script parses with the tree-sitter PowerShell
//!   grammar. That is a third-party grammar (airbus-cert), not PowerShell's
//!   own parser, which no registry reachable from the project's machines
//!   provides: it catches unbalanced braces, broken strings and here-strings,
//!   malformed parameter blocks and the like, not misspelled cmdlets or
//!   wrong parameters. The scripts are also checked to be ASCII (Windows
//!   PowerShell 5.1 reads a file without a byte-order mark in the ANSI code
//!   page), to carry comment-based help and strict error handling, and to
//!   name only scripts that exist; so must the docs.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use kstack_abi::{
    DRIVER_FILE_NAME, KSTACK_VERSION, PARAMETERS_KEY, RING_CAPACITY_VALUE, SERVICE_NAME,
};
use kstack_driver_core::ring::{CAPACITY_RANGE_KIB, DEFAULT_CAPACITY_KIB};
use kstack_tests::{
    folders::{package_dir, workspace},
    inf::Inf,
};
use yaml_rust2::{Yaml, YamlLoader};

/// The System setup class (the `LegacyDriver` class is reserved for the
/// system; see the comment at the top of `inf/kstack.inx`).
const SYSTEM_CLASS_GUID: &str = "{4d36e97d-e325-11ce-bfc1-08002be10318}";
/// `FLG_ADDREG_TYPE_DWORD`.
const ADDREG_TYPE_DWORD: u32 = 0x0001_0001;
/// Tasks of wdk-build 0.6.0's rust-driver-makefile.toml that Makefile.toml uses.
const WDK_BUILD_TASKS: [&str; 2] = ["generate-certificate", "signtool-sign"];
/// The scripts the runbooks use.
const SCRIPTS: [&str; 7] = [
    "enable-test-signing.ps1",
    "install-test-certificate.ps1",
    "kstack-common.psm1",
    "kstack-service.ps1",
    "paging-executive.ps1",
    "sign-driver.ps1",
    "verifier-smoke.ps1",
];

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
}

/// An INF file's text (stampinf keeps the INX's encoding; `SetupAPI` also
/// reads UTF-16).
fn read_inf(path: &Path) -> String {
    let bytes =
        fs::read(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
    Inf::decode(&bytes).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn parse_inf(path: &Path) -> Inf {
    Inf::parse(&read_inf(path)).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// `kstack.cat`: the catalog is named after the image.
fn catalog_name() -> String {
    let stem = DRIVER_FILE_NAME
        .strip_suffix(".sys")
        .expect("the driver file is a .sys");
    format!("{stem}.cat")
}

/// The checks both the INX and the stamped INF must pass; `arch` is what
/// the architecture decoration reads (`$ARCH$` before stamping).
fn check_service_inf(inf: &Inf, arch: &str) {
    let version = |key: &str| inf.value("Version", key);
    assert!(
        version("Signature").is_some_and(|value| value.eq_ignore_ascii_case("$WINDOWS NT$")),
        "[Version] Signature must be \"$WINDOWS NT$\""
    );
    assert_eq!(version("Class"), Some("System"));
    assert!(
        version("ClassGuid").is_some_and(|guid| guid.eq_ignore_ascii_case(SYSTEM_CLASS_GUID)),
        "[Version] ClassGuid must be the System class, {SYSTEM_CLASS_GUID}"
    );
    assert!(
        version("Provider").is_some_and(|provider| !provider.is_empty()),
        "a primitive driver's [Version] names its Provider"
    );
    assert_eq!(version("CatalogFile"), Some(catalog_name().as_str()));
    assert_eq!(version("PnpLockdown"), Some("1"));
    assert!(
        inf.values("Version", "DriverVer").is_some(),
        "[Version] has a DriverVer line for stampinf"
    );

    // Primitive-driver rules: no models, only decorated [DefaultInstall]
    // sections, no [DefaultUninstall].
    let install = format!("DefaultInstall.NT{arch}");
    assert!(inf.section("Manufacturer").is_none(), "no [Manufacturer]");
    for section in inf.sections() {
        let name = section.name.to_ascii_lowercase();
        assert!(
            !name.starts_with("defaultuninstall"),
            "[{}]: primitive drivers have no uninstall section",
            section.name
        );
        if name.starts_with("defaultinstall") {
            assert!(
                section.name.eq_ignore_ascii_case(&install)
                    || section
                        .name
                        .eq_ignore_ascii_case(&format!("{install}.Services")),
                "[{}] is not decorated for {arch}",
                section.name
            );
        }
    }

    // The files: kstack.sys copied to the driver store (DIRID 13).
    let copy_files = inf
        .value(&install, "CopyFiles")
        .unwrap_or_else(|| panic!("[{install}] CopyFiles"));
    let copied = inf
        .section(copy_files)
        .unwrap_or_else(|| panic!("[{copy_files}]"));
    assert!(
        copied.lines.iter().any(|line| line.key.is_none()
            && line
                .values
                .first()
                .is_some_and(|file| file == DRIVER_FILE_NAME)),
        "[{copy_files}] copies {DRIVER_FILE_NAME}"
    );
    assert!(
        inf.values("SourceDisksFiles", DRIVER_FILE_NAME).is_some(),
        "[SourceDisksFiles] lists {DRIVER_FILE_NAME}"
    );
    let destination = inf
        .value("DestinationDirs", copy_files)
        .or_else(|| inf.value("DestinationDirs", "DefaultDestDir"));
    assert_eq!(destination, Some("13"), "files go to the driver store");

    check_service(inf, &format!("{install}.Services"));
}

/// The service the INF installs, and its `Parameters\RingCapacity`.
fn check_service(inf: &Inf, services: &str) {
    let add_service = inf
        .values(services, "AddService")
        .unwrap_or_else(|| panic!("[{services}] AddService"));
    let [name, _flags, service_section, ..] = add_service else {
        panic!("AddService needs a name, flags and a section: {add_service:?}");
    };
    assert_eq!(name, SERVICE_NAME);
    let service = |key: &str| inf.value(service_section, key);
    assert_eq!(service("ServiceType"), Some("1"), "SERVICE_KERNEL_DRIVER");
    assert_eq!(service("StartType"), Some("3"), "SERVICE_DEMAND_START");
    assert_eq!(service("ErrorControl"), Some("1"), "SERVICE_ERROR_NORMAL");
    assert_eq!(
        service("ServiceBinary"),
        Some(format!("%13%\\{DRIVER_FILE_NAME}").as_str())
    );

    // Parameters\RingCapacity: the driver's default, within its range.
    let add_reg = service("AddReg").expect("the service section has AddReg");
    let registry = inf
        .section(add_reg)
        .unwrap_or_else(|| panic!("[{add_reg}]"));
    let ring = registry
        .lines
        .iter()
        .find(|line| {
            line.key.is_none()
                && line.values.len() == 5
                && line.values[0].eq_ignore_ascii_case("HKR")
                && line.values[1].eq_ignore_ascii_case(PARAMETERS_KEY)
                && line.values[2] == RING_CAPACITY_VALUE
        })
        .unwrap_or_else(|| {
            panic!("[{add_reg}] sets HKR,{PARAMETERS_KEY},{RING_CAPACITY_VALUE},flags,value")
        });
    let flags = u32::from_str_radix(ring.values[3].trim_start_matches("0x"), 16)
        .unwrap_or_else(|error| panic!("flags {}: {error}", ring.values[3]));
    assert_eq!(flags, ADDREG_TYPE_DWORD, "RingCapacity is a REG_DWORD");
    let kib: u32 = ring.values[4]
        .parse()
        .unwrap_or_else(|error| panic!("RingCapacity {}: {error}", ring.values[4]));
    assert_eq!(
        kib, DEFAULT_CAPACITY_KIB,
        "the INF sets the driver's default"
    );
    assert!(CAPACITY_RANGE_KIB.contains(&kib));
}

#[test]
fn inx_installs_the_service_the_driver_expects() {
    let inf = parse_inf(&workspace().join("inf/kstack.inx"));
    check_service_inf(&inf, "$ARCH$");
    assert_eq!(
        inf.values("Version", "DriverVer"),
        Some(&[] as &[String]),
        "the INX leaves DriverVer to stampinf"
    );
}

#[test]
fn package_inf_is_the_inx_stamped_for_amd64() {
    let inf_path = package_dir().join("kstack.inf");
    assert!(
        inf_path.is_file(),
        "{} is missing: run `cargo xtask test` (or `cargo make` on Windows), which builds the package",
        inf_path.display()
    );
    let text = read_inf(&inf_path);
    assert!(!text.contains("$ARCH$"), "stamping replaces every $ARCH$");
    let inf = parse_inf(&inf_path);
    check_service_inf(&inf, "amd64");

    let driver_ver = inf
        .values("Version", "DriverVer")
        .expect("[Version] DriverVer");
    let [date, version] = driver_ver else {
        panic!("DriverVer is date,version: {driver_ver:?}");
    };
    let parts: Vec<&str> = date.split('/').collect();
    assert!(
        matches!(parts.as_slice(), [month, day, year]
            if month.len() == 2 && day.len() == 2 && year.len() == 4
            && parts.iter().all(|part| part.bytes().all(|byte| byte.is_ascii_digit()))),
        "DriverVer's date is MM/DD/YYYY: {date}"
    );
    let (major, minor, patch) = KSTACK_VERSION;
    assert_eq!(version, &format!("{major}.{minor}.{patch}.0"));

    // Apart from DriverVer, the INF says what the INX says (in any order
    // within a section: stampinf may move lines).
    let source_inf = parse_inf(&workspace().join("inf/kstack.inx"));
    assert_eq!(source_inf.sections().len(), inf.sections().len());
    for (source, stamped) in source_inf.sections().iter().zip(inf.sections()) {
        assert!(
            source
                .name
                .replace("$ARCH$", "amd64")
                .eq_ignore_ascii_case(&stamped.name),
            "[{}] became [{}]",
            source.name,
            stamped.name
        );
        let lines = |section: &kstack_tests::inf::Section| {
            section
                .lines
                .iter()
                .filter(|line| {
                    !line
                        .key
                        .as_deref()
                        .is_some_and(|key| key.eq_ignore_ascii_case("DriverVer"))
                })
                .map(|line| (line.key.clone(), line.values.clone()))
                .collect::<BTreeSet<_>>()
        };
        assert_eq!(lines(source), lines(stamped), "[{}]", stamped.name);
    }
}

fn makefile() -> toml_edit::DocumentMut {
    read(&workspace().join("Makefile.toml"))
        .parse()
        .unwrap_or_else(|error| panic!("Makefile.toml: {error}"))
}

fn makefile_tasks(makefile: &toml_edit::DocumentMut) -> &toml_edit::Table {
    makefile
        .get("tasks")
        .and_then(toml_edit::Item::as_table)
        .expect("Makefile.toml has [tasks]")
}

/// A string array's strings; none for a missing key.
fn strings(item: Option<&toml_edit::Item>) -> Vec<String> {
    item.and_then(toml_edit::Item::as_array)
        .map(|array| {
            array
                .iter()
                .filter_map(|value| value.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn makefile_windows_flow_is_complete_and_versioned() {
    let makefile = makefile();
    let tasks = makefile_tasks(&makefile);
    for name in [
        "default",
        "package-dir",
        "kstack-windows-package",
        "kstack-linux-package",
    ] {
        assert!(tasks.contains_key(name), "task {name}");
    }
    for (name, task) in tasks {
        let mut referenced = strings(task.get("dependencies"));
        for key in ["run_task", "linux_alias"] {
            referenced.extend(
                task.get(key)
                    .and_then(toml_edit::Item::as_str)
                    .map(str::to_owned),
            );
        }
        for other in referenced {
            assert!(
                tasks.contains_key(&other) || WDK_BUILD_TASKS.contains(&other.as_str()),
                "task {name} refers to {other}, which neither Makefile.toml nor wdk-build 0.6.0 defines"
            );
        }
    }

    let (major, minor, patch) = KSTACK_VERSION;
    assert_eq!(
        makefile
            .get("env")
            .and_then(|env| env.get("KSTACK_DRIVER_VERSION"))
            .and_then(toml_edit::Item::as_str),
        Some(format!("{major}.{minor}.{patch}.0").as_str()),
        "DriverVer's version is the workspace version"
    );
    let task = |name: &str, key: &str| tasks.get(name).and_then(|task| task.get(key));
    let layout = task("kstack-windows-layout", "script")
        .and_then(toml_edit::Item::as_str)
        .expect("the layout task is a script");
    assert!(layout.contains("/inf/kstack.inx ${KSTACK_PACKAGE_DIR}/kstack.inf"));
    let stamp = strings(task("kstack-stampinf", "args"));
    let catalog = catalog_name();
    assert!(
        stamp
            .windows(2)
            .any(|pair| pair == ["-c", catalog.as_str()]),
        "stampinf -c {catalog}: {stamp:?}"
    );
}

/// `text` parsed with tree-sitter-powershell.
fn powershell_tree(text: &str) -> tree_sitter::Tree {
    let mut parser = tree_sitter::Parser::new();
    parser
        .set_language(&tree_sitter_powershell::LANGUAGE.into())
        .expect("the grammar matches the tree-sitter runtime");
    parser.parse(text, None).expect("the parser returns a tree")
}

/// Every node of `tree`, parents before their children.
fn powershell_nodes(tree: &tree_sitter::Tree) -> Vec<tree_sitter::Node<'_>> {
    let mut nodes = Vec::new();
    let mut stack = vec![tree.root_node()];
    while let Some(node) = stack.pop() {
        nodes.push(node);
        let mut cursor = node.walk();
        stack.extend(node.children(&mut cursor));
    }
    nodes
}

/// Every ERROR or MISSING node tree-sitter-powershell finds, as `line:column kind`.
fn powershell_errors(text: &str) -> Vec<String> {
    powershell_nodes(&powershell_tree(text))
        .into_iter()
        .filter(|node| node.is_error() || node.is_missing())
        .map(|node| {
            let at = node.start_position();
            format!(
                "{}:{} {}{}",
                at.row + 1,
                at.column + 1,
                if node.is_missing() { "missing " } else { "" },
                node.kind()
            )
        })
        .collect()
}

/// The nearest ancestor of `node` of one of `kinds`.
fn ancestor<'t>(node: tree_sitter::Node<'t>, kinds: &[&str]) -> Option<tree_sitter::Node<'t>> {
    std::iter::successors(node.parent(), tree_sitter::Node::parent)
        .find(|parent| kinds.contains(&parent.kind()))
}

/// A command as written: its name, its elements (parameters and
/// arguments, as text), and where it is.
struct Command<'t> {
    name: String,
    elements: Vec<String>,
    node: tree_sitter::Node<'t>,
}

impl Command<'_> {
    fn named(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
    }

    fn has_element(&self, element: &str) -> bool {
        self.elements
            .iter()
            .any(|found| found.eq_ignore_ascii_case(element))
    }
}

/// Every command in `tree` (a script or a doc's PowerShell block).
fn powershell_commands<'t>(tree: &'t tree_sitter::Tree, text: &str) -> Vec<Command<'t>> {
    let node_text = |node: tree_sitter::Node<'_>| text[node.byte_range()].to_owned();
    powershell_nodes(tree)
        .into_iter()
        .filter(|node| node.kind() == "command")
        .filter_map(|node| {
            let name = node.child_by_field_name("command_name")?;
            let elements =
                node.child_by_field_name("command_elements")
                    .map_or_else(Vec::new, |elements| {
                        let mut cursor = elements.walk();
                        elements
                            .named_children(&mut cursor)
                            .filter(|element| element.kind() != "command_argument_sep")
                            .map(node_text)
                            .collect()
                    });
            Some(Command {
                name: node_text(name),
                elements,
                node,
            })
        })
        .collect()
}

/// Every script (by name) and every `powershell` block of README.md and
/// docs/ (by the doc's name and the block's first line), with its text.
fn powershell_texts() -> Vec<(String, String)> {
    let mut texts: Vec<(String, String)> = SCRIPTS
        .iter()
        .map(|name| ((*name).to_owned(), read(&scripts_dir().join(name))))
        .collect();
    for doc in doc_files() {
        let text = read(&doc);
        let mut rest = text.as_str();
        while let Some(start) = rest.find("```powershell\n") {
            let block = &rest[start + "```powershell\n".len()..];
            let end = block.find("```").expect("a closed code block");
            let line = text[..text.len() - block.len()].lines().count();
            texts.push((format!("{}:{line}", doc.display()), block[..end].to_owned()));
            rest = &block[end + 3..];
        }
    }
    texts
}

#[test]
fn powershell_checker_catches_broken_scripts() {
    assert_eq!(
        powershell_errors("function F { if ($a) { 'x' } }\n"),
        [] as [String; 0]
    );
    for broken in [
        "function F { if ($a) { 'x' }\n",
        "$a = \"unterminated\nWrite-Host $a\n",
        "$h = @'\nno end\n",
        "param([string] $A,)\n",
        "$x = @{ a = 1; b = }\n",
    ] {
        assert!(
            !powershell_errors(broken).is_empty(),
            "not caught: {broken}"
        );
    }
}

fn has_extension(name: &str, extension: &str) -> bool {
    Path::new(name)
        .extension()
        .is_some_and(|found| found.eq_ignore_ascii_case(extension))
}

fn scripts_dir() -> PathBuf {
    workspace().join("scripts/windows")
}

#[test]
fn scripts_parse_and_follow_the_conventions() {
    let dir = scripts_dir();
    let found: BTreeSet<String> = fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| {
            entry
                .expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| has_extension(name, "ps1") || has_extension(name, "psm1"))
        .collect();
    assert_eq!(
        found,
        SCRIPTS.iter().map(|name| (*name).to_owned()).collect()
    );

    for name in SCRIPTS {
        let text = read(&dir.join(name));
        assert!(text.is_ascii(), "{name} is not ASCII");
        let errors = powershell_errors(&text);
        assert!(errors.is_empty(), "{name} does not parse: {errors:?}");
        assert!(
            text.contains("Set-StrictMode -Version Latest")
                && text.contains("$ErrorActionPreference = 'Stop'"),
            "{name} sets strict mode and stops on errors"
        );
        assert!(
            text.contains("<#") && text.contains(".SYNOPSIS"),
            "{name} has comment-based help"
        );
        if has_extension(name, "ps1") {
            assert!(
                text.starts_with("#Requires -RunAsAdministrator"),
                "{name} says it needs an elevated prompt"
            );
            assert!(text.contains(".EXAMPLE"), "{name} has an example");
            assert!(
                text.contains("Import-Module (Join-Path $PSScriptRoot 'kstack-common.psm1')"),
                "{name} imports the shared module from beside it"
            );
        }
        for mentioned in mentioned_scripts(&text) {
            assert!(
                SCRIPTS.contains(&mentioned.as_str()),
                "{name} mentions {mentioned}, which does not exist"
            );
        }
    }
}

#[test]
fn service_script_explains_the_errors_people_meet() {
    let module = read(&scripts_dir().join("kstack-common.psm1"));
    for code in [2, 5, 577, 1060, 1062, 1073, 1275] {
        let explained = module.lines().any(|line| {
            line.trim_start().starts_with(&format!("{code} ")) && line.contains("= 'ERROR_")
        });
        assert!(explained, "kstack-common.psm1 explains sc.exe error {code}");
    }
}

/// Names like `something.ps1` or `.psm1` in a text.
/// The text of the PowerShell function `name` in `script`: from its
/// `function` line to the next one.
fn powershell_function<'s>(script: &'s str, name: &str) -> &'s str {
    let start = script
        .find(&format!("function {name} {{"))
        .unwrap_or_else(|| panic!("no function {name}"));
    let rest = &script[start..];
    let end = rest[1..]
        .find("\nfunction ")
        .map_or(rest.len(), |end| end + 1);
    &rest[..end]
}

#[test]
fn the_driver_is_stopped_only_after_its_clients_are_closed() {
    // Windows runs DriverUnload only once every handle to the device is
    // closed: every stop goes through Stop-KStackDriver, which closes the
    // kstack.exe clients first and fails on a stop left STOP_PENDING.
    let dir = scripts_dir();
    let common = read(&dir.join("kstack-common.psm1"));
    let stop = powershell_function(&common, "Stop-KStackDriver");
    let closed = stop
        .find("Close-KStackClients")
        .expect("Stop-KStackDriver closes the clients");
    let stopped = stop
        .find("'stop', 'kstack'")
        .expect("Stop-KStackDriver runs sc.exe stop");
    assert!(closed < stopped, "clients are closed before sc.exe stop");
    assert!(
        stop.contains("'Stop Pending'") && stop.contains("STOP_PENDING"),
        "a stop left pending fails, saying so"
    );
    assert!(
        powershell_function(&common, "Close-KStackClients").contains("Get-Process -Name 'kstack'"),
        "Close-KStackClients ends every kstack.exe"
    );
    for script in SCRIPTS {
        let text = read(&dir.join(script));
        let direct = text.matches("'stop', 'kstack'").count();
        let allowed = usize::from(script == "kstack-common.psm1");
        assert_eq!(
            direct, allowed,
            "{script} stops the driver without Stop-KStackDriver"
        );
    }
}

fn mentioned_scripts(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for extension in [".ps1", ".psm1"] {
        for (at, _) in text.match_indices(extension) {
            let start = text[..at]
                .rfind(|character: char| !(character.is_ascii_alphanumeric() || character == '-'))
                .map_or(0, |index| index + 1);
            let end = at + extension.len();
            let follows_word = text[end..]
                .chars()
                .next()
                .is_some_and(|character| character.is_ascii_alphanumeric());
            if start < at && !follows_word {
                names.insert(text[start..end].to_owned());
            }
        }
    }
    names
}

/// README.md and every Markdown file in docs/.
fn doc_files() -> Vec<PathBuf> {
    let root = workspace();
    let mut docs = vec![root.join("README.md")];
    let docs_dir = root.join("docs");
    docs.extend(
        fs::read_dir(&docs_dir)
            .unwrap_or_else(|error| panic!("{}: {error}", docs_dir.display()))
            .map(|entry| entry.expect("directory entry").path())
            .filter(|path| path.extension().is_some_and(|extension| extension == "md")),
    );
    docs
}

#[test]
fn docs_name_only_scripts_that_exist() {
    let mut named = BTreeSet::new();
    for doc in &doc_files() {
        for mentioned in mentioned_scripts(&read(doc)) {
            assert!(
                SCRIPTS.contains(&mentioned.as_str()),
                "{} mentions {mentioned}, which scripts/windows lacks",
                doc.display()
            );
            named.insert(mentioned);
        }
    }
    for script in SCRIPTS.iter().filter(|name| has_extension(name, "ps1")) {
        assert!(named.contains(*script), "no doc explains {script}");
    }
}

fn workflow() -> Yaml {
    let path = workspace().join(".github/workflows/ci.yml");
    let mut docs = YamlLoader::load_from_str(&read(&path))
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    assert_eq!(docs.len(), 1, "one YAML document");
    docs.remove(0)
}

fn step_runs(job: &Yaml) -> Vec<&str> {
    job["steps"]
        .as_vec()
        .expect("a job has steps")
        .iter()
        .filter_map(|step| step["run"].as_str())
        .collect()
}

#[test]
fn workflow_has_the_linux_and_windows_jobs() {
    let workflow = workflow();
    let jobs = workflow["jobs"].as_hash().expect("the workflow has jobs");
    assert_eq!(jobs.len(), 2, "two jobs: linux and windows");

    let linux = &workflow["jobs"]["linux"];
    assert!(
        linux["runs-on"]
            .as_str()
            .is_some_and(|runner| runner.starts_with("ubuntu")),
        "the Linux job runs on ubuntu"
    );
    assert!(
        step_runs(linux).iter().any(|run| run.contains(".ci/run")),
        "the Linux job runs .ci/run, what the project's own CI runs"
    );

    let windows = &workflow["jobs"]["windows"];
    assert!(
        windows["runs-on"]
            .as_str()
            .is_some_and(|runner| runner.starts_with("windows")),
        "the Windows job runs on windows"
    );
    let runs = step_runs(windows);
    for needed in [
        "Microsoft.Windows.WDK.x64",
        "cargo make",
        "--test driver_image",
        "--test windows_deliverables",
    ] {
        assert!(
            runs.iter().any(|run| run.contains(needed)),
            "a Windows step runs {needed}"
        );
    }
    // Windows runners run `run:` steps with pwsh.
    for run in runs {
        assert!(
            !run.contains("${{"),
            "pass expressions through env:, not into script text: {run}"
        );
        let errors = powershell_errors(run);
        assert!(errors.is_empty(), "step does not parse: {errors:?}\n{run}");
    }
}

#[test]
fn the_paging_script_sets_the_override_the_driver_reads_and_only_for_the_value_1() {
    let script = read(&scripts_dir().join("paging-executive.ps1"));
    let override_value = kstack_abi::paging::ASSUME_IN_EFFECT_VALUE;
    assert!(
        script.contains(&format!("$override = '{override_value}'")),
        "paging-executive.ps1 names Parameters\\{override_value}"
    );
    let assume = script
        .find("'Assume' {")
        .expect("paging-executive.ps1 has -AssumeInEffect");
    let refuse = script[assume..]
        .find("if ($current -ne 1) {\n            throw")
        .expect("-AssumeInEffect refuses a value other than 1");
    let set = script[assume..]
        .find("Set-KStackParameter -Name $override -Value 1")
        .expect("-AssumeInEffect sets the override");
    assert!(
        refuse < set,
        "the value is checked before the override is set"
    );
    // A new value needs a reboot: -Enable and -Disable drop any override.
    for action in ["'Enable' {", "'Disable' {"] {
        let start = script.find(action).expect(action);
        let end = start + script[start..].find("\n    }").expect("end of the action");
        assert!(
            script[start..end].contains("Remove-KStackParameter -Name $override"),
            "{action} removes the override"
        );
    }
    // The smoke test asks the driver, not the registry, whether it is in effect.
    let smoke = read(&scripts_dir().join("verifier-smoke.ps1"));
    assert!(smoke.contains("(Get-KStackStatus -PackageDir $package).paging_executive"));
    assert!(smoke.contains("if ($paging.in_effect) {"));
}

/// The text of `verifier-smoke.ps1`'s step `name`: from its `Step` line to
/// the next step's.
fn smoke_step<'s>(smoke: &'s str, name: &str) -> &'s str {
    let start = smoke
        .find(&format!("Step '{name}' {{"))
        .unwrap_or_else(|| panic!("no step {name}"));
    let rest = &smoke[start..];
    let end = rest[1..].find("Step ").map_or(rest.len(), |end| end + 1);
    &rest[..end]
}

#[test]
fn the_parameters_key_is_created_only_when_absent() {
    // New-Item -Force on a registry key that exists deletes it and makes
    // it anew, empty: the values set before it (RingCapacity,
    // StackTableEntries, the altitudes, the paging override) would go.
    let mut new_items = 0;
    for (place, text) in powershell_texts() {
        let tree = powershell_tree(&text);
        for command in powershell_commands(&tree, &text) {
            if !command.named("New-Item") {
                continue;
            }
            new_items += 1;
            let on_parameters = command.elements.iter().any(|element| {
                element.contains("$script:ParametersKey")
                    || element.contains("$parameters")
                    || element.to_ascii_lowercase().contains(
                        &format!("\\{SERVICE_NAME}\\{PARAMETERS_KEY}").to_ascii_lowercase(),
                    )
            });
            assert!(
                !(on_parameters && command.has_element("-Force")),
                "{place}: `{}` wipes the Parameters key",
                &text[command.node.byte_range()]
            );
        }
    }
    assert!(new_items >= 3, "the New-Item commands were found");
    let common = read(&scripts_dir().join("kstack-common.psm1"));
    let set = powershell_function(&common, "Set-KStackParameter");
    assert!(
        set.contains(
            "if (-not (Test-Path -LiteralPath $script:ParametersKey)) {\n        New-Item -Path $script:ParametersKey | Out-Null"
        ),
        "Set-KStackParameter creates the key only when it is absent"
    );
    let runbook = read(&workspace().join("docs/windows-test-vm.md"));
    assert!(
        runbook.contains("if (-not (Test-Path $parameters)) { New-Item $parameters | Out-Null }"),
        "the runbook's manual command creates the key only when it is absent"
    );
}

#[test]
fn invoke_native_finds_the_program_resets_the_exit_code_and_keeps_stderr_apart() {
    let common = read(&scripts_dir().join("kstack-common.psm1"));
    let native = powershell_function(&common, "Invoke-Native");
    // A program that is not found runs not and sets no exit code: the
    // last program's (0 after a success) would be taken for its.
    let at = |needle: &str| {
        native
            .find(needle)
            .unwrap_or_else(|| panic!("Invoke-Native lacks `{needle}`"))
    };
    let found = at("Get-Command -Name $FilePath -CommandType Application");
    let missing = at("if (-not $program) {\n        throw");
    let reset = at("$global:LASTEXITCODE = $null");
    let run = at("& $program @Arguments 2>&1");
    let code = at("$code = $global:LASTEXITCODE");
    let unset = at("if ($null -eq $code) {\n        throw");
    assert!(
        found < missing && missing < reset && reset < run && run < code && code < unset,
        "Invoke-Native looks the program up, resets the exit code, runs it, then reads the code"
    );
    // Programs set the global $LASTEXITCODE; a local one would hide it.
    for line in native
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
    {
        assert_eq!(
            line.matches("LASTEXITCODE").count(),
            line.matches("$global:LASTEXITCODE").count(),
            "Invoke-Native names $LASTEXITCODE only in the global scope: {line}"
        );
    }
    // stderr apart from stdout, which callers parse as JSON.
    assert!(native.contains(
        "if ($_ -is [System.Management.Automation.ErrorRecord]) {\n            $stderr.Add("
    ));
    assert!(
        native.contains("Output   = ($stdout -join")
            && native.contains("Errors   = ($stderr -join"),
        "Invoke-Native returns stdout and stderr apart"
    );
    assert!(
        powershell_function(&common, "Get-KStackStatus")
            .contains("@('status', '--json')).Output | ConvertFrom-Json"),
        "status --json is parsed from stdout alone"
    );
    for name in SCRIPTS {
        for line in read(&scripts_dir().join(name))
            .lines()
            .filter(|line| line.contains("ConvertFrom-Json"))
        {
            assert!(
                !line.contains(".Text") && !line.contains(".Errors"),
                "{name} parses stderr as JSON: {line}"
            );
        }
    }
}

#[test]
fn the_smoke_suite_always_ends_with_its_summary() {
    let smoke = read(&scripts_dir().join("verifier-smoke.ps1"));
    let tree = powershell_tree(&smoke);
    let commands = powershell_commands(&tree, &smoke);
    let summary = commands
        .iter()
        .find(|command| {
            command.named("Write-Host")
                && command
                    .elements
                    .iter()
                    .any(|element| element.contains("passed, {1} failed"))
        })
        .expect("the summary line");
    assert!(
        ancestor(summary.node, &["finally_clause"]).is_some(),
        "the summary is written from a finally block"
    );
    let outer = ancestor(summary.node, &["try_statement"]).expect("the try around the suite");
    // Everything of the suite that can fail runs inside that try, and
    // there inside a step (one failure, and the next step runs), but the
    // package's lookup, without which no step can run; only the
    // transcript's setup comes before it.
    let suite = smoke
        .find("# ---- the smoke suite ----")
        .expect("the suite's part of the script");
    let mut steps = 0;
    for command in commands
        .iter()
        .filter(|command| command.node.start_byte() > suite)
        .filter(|command| ancestor(command.node, &["function_statement"]).is_none())
    {
        let ancestors: Vec<_> =
            std::iter::successors(command.node.parent(), tree_sitter::Node::parent).collect();
        let text = &smoke[command.node.byte_range()];
        if !ancestors.contains(&outer) {
            assert!(
                ["Join-Path", "Get-Date", "Start-Transcript", "Out-Null"]
                    .iter()
                    .any(|name| command.named(name)),
                "verifier-smoke.ps1 runs `{text}` outside the try whose finally writes the summary"
            );
            continue;
        }
        let in_step = ancestors.iter().any(|parent| {
            parent.kind() == "command"
                && parent
                    .child_by_field_name("command_name")
                    .is_some_and(|name| &smoke[name.byte_range()] == "Step")
        });
        let summing_up = ancestors
            .iter()
            .any(|parent| matches!(parent.kind(), "catch_clause" | "finally_clause"));
        steps += usize::from(command.named("Step"));
        assert!(
            in_step
                || summing_up
                || command.named("Step")
                || command.named("Resolve-KStackPackage"),
            "verifier-smoke.ps1 runs `{text}` outside a step: should it fail, the steps after it would not run"
        );
    }
    assert!(steps >= 10, "the steps were found inside the try: {steps}");
}

#[test]
fn read_and_clear_leaves_the_module_records_alone() {
    // Every kstack.exe run adds module records (image loads, process
    // exit) whatever the sources' settings: the ring is never empty after
    // a clear. What clear must leave is no trace record, and read --json
    // prints trace records only.
    let smoke = read(&scripts_dir().join("verifier-smoke.ps1"));
    let step = smoke_step(&smoke, "read and clear");
    for (at, _) in step.match_indices("ring.used") {
        let comparison = step[at + "ring.used".len()..].trim_start();
        assert!(
            !["-ne 0", "-gt 0", "-eq 0"]
                .iter()
                .any(|test| comparison.starts_with(test)),
            "the step expects an empty ring after clear: {}",
            &step[at..]
        );
    }
    let clear = step.find("@('clear')").expect("the step clears");
    let disabled = step[..clear]
        .rfind("@('config', '--disable', 'all')")
        .expect("the sources are off before the clear");
    let selftest = step[..disabled]
        .rfind("@('selftest')")
        .expect("a record is left for clear to discard");
    assert!(selftest < disabled);
    let after = &step[clear..];
    assert!(
        after.contains("$after.cleared -le $before.cleared"),
        "clear is seen to discard something"
    );
    assert!(
        after.contains("$left = @(Get-KStackRecords)")
            && after.contains("if ($left.Count -ne 0) {"),
        "after clear no trace record is left"
    );
    assert!(
        powershell_function(&smoke, "Get-KStackRecords")
            .contains("-Arguments @('read', '--json')).Output -split"),
        "the records are read --json's stdout, one a line"
    );
}

/// Every key of `value`'s objects, at any depth.
fn json_keys(value: &serde_json::Value, keys: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(object) => {
            for (key, inner) in object {
                keys.insert(key.clone());
                json_keys(inner, keys);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                json_keys(item, keys);
            }
        }
        _ => {}
    }
}

/// The keys of the client's `status --json` and `read --json` objects.
fn client_json_keys() -> BTreeSet<String> {
    use kstack_abi::{RecordFlags, SourceFacts, decode_record};
    use kstack_client::{
        capture::trace::TraceRecord,
        device::test_support::{record_bytes, sample_status},
        naming::{modules::ModuleMap, symbolizer::Symbolizer},
    };

    let status = sample_status();
    let bytes = record_bytes(
        1,
        SourceFacts::OnDemand { tag: 0 },
        RecordFlags::NONE,
        &[0x1000],
        &[0x1000],
    );
    let (view, _) = decode_record(&bytes).expect("a record test_support encoded");
    let record = TraceRecord::from(&view);
    let mut keys = BTreeSet::new();
    json_keys(
        &kstack_client::output::report::status_json(&status),
        &mut keys,
    );
    json_keys(
        &record.to_json(&Symbolizer::new(ModuleMap::default())),
        &mut keys,
    );
    keys
}

#[test]
fn the_scripts_read_only_fields_the_client_writes() {
    // The scripts' lower-case members are JSON fields (PowerShell's and
    // .NET's own members are PascalCase): each must be a key of the
    // client's status --json or read --json.
    let keys = client_json_keys();
    for needed in ["ring", "used", "cleared", "module_records", "source"] {
        assert!(keys.contains(needed), "the client's JSON has {needed}");
    }
    let mut fields = 0;
    for name in SCRIPTS {
        let text = read(&scripts_dir().join(name));
        let tree = powershell_tree(&text);
        for node in powershell_nodes(&tree)
            .into_iter()
            .filter(|node| node.kind() == "member_name")
        {
            let member = &text[node.byte_range()];
            if member.starts_with(|first: char| first.is_ascii_lowercase()) {
                fields += 1;
                assert!(
                    keys.contains(member),
                    "{name}:{} reads .{member}, which the client's JSON lacks",
                    node.start_position().row + 1
                );
            }
        }
    }
    assert!(
        fields >= 20,
        "the scripts' JSON fields were found: {fields}"
    );
}

/// The file redirections (`>`, `>>`, `2>` ...) of a PowerShell text, but
/// those to `$null`.
fn file_redirections(text: &str) -> Vec<String> {
    let tree = powershell_tree(text);
    powershell_nodes(&tree)
        .into_iter()
        .filter(|node| node.kind() == "redirection")
        .filter(|node| {
            let mut cursor = node.walk();
            let to_file = node
                .named_children(&mut cursor)
                .any(|child| child.kind() == "file_redirection_operator");
            to_file
                && !text[node.byte_range()]
                    .to_ascii_lowercase()
                    .ends_with("$null")
        })
        .map(|node| text[node.byte_range()].to_owned())
        .collect()
}

#[test]
fn no_powershell_text_redirects_into_a_file() {
    // Windows PowerShell 5.1's > and >> write UTF-16 LE: a JSON or text
    // file others read goes through Out-File -Encoding utf8 (or
    // Set-Content) instead.
    assert_eq!(
        file_redirections("kstack.exe status --json > \"table.json\"\nNew-Item x > $null\n"),
        ["> \"table.json\""]
    );
    let texts = powershell_texts();
    assert!(
        texts.len() > SCRIPTS.len() + 10,
        "the docs' PowerShell blocks were found"
    );
    for (place, text) in texts {
        let found = file_redirections(&text);
        assert!(found.is_empty(), "{place} redirects into a file: {found:?}");
    }
}

#[test]
fn the_certificate_folder_exists_before_wdk_builds_certificate_tasks() {
    // wdk-build's generate-certificate (a dependency of its signtool-sign)
    // writes into WDK_BUILD_OUTPUT_DIRECTORY, the dev profile's folder,
    // which kstack's release-only flow never creates.
    let makefile = makefile();
    let tasks = makefile_tasks(&makefile);
    let folder = "kstack-wdk-output-directory";
    let script = tasks
        .get(folder)
        .and_then(|task| task.get("script"))
        .and_then(toml_edit::Item::as_str)
        .unwrap_or_else(|| panic!("task {folder} is a script"));
    assert_eq!(script, "mkdir ${WDK_BUILD_OUTPUT_DIRECTORY}");
    let mut reaching = Vec::new();
    for (name, task) in tasks {
        let dependencies = strings(task.get("dependencies"));
        let certificate = dependencies
            .iter()
            .position(|dependency| dependency == "generate-certificate");
        let signs = task.get("run_task").and_then(toml_edit::Item::as_str) == Some("signtool-sign");
        if certificate.is_none() && !signs {
            continue;
        }
        let made = dependencies
            .iter()
            .position(|dependency| dependency == folder)
            .unwrap_or_else(|| {
                panic!("{name} reaches generate-certificate before {folder} made its folder")
            });
        assert!(
            certificate.is_none_or(|certificate| made < certificate),
            "{name}: {folder} comes before generate-certificate"
        );
        reaching.push(name.to_owned());
    }
    assert_eq!(
        reaching,
        [
            "kstack-sign-driver",
            "kstack-sign-catalog",
            "kstack-copy-certificate"
        ]
    );
    // The Linux flow stays cargo xtask build.
    let default = tasks.get("default").expect("task default");
    assert_eq!(
        default.get("linux_alias").and_then(toml_edit::Item::as_str),
        Some("kstack-linux-package")
    );
    assert_eq!(
        strings(
            tasks
                .get("kstack-linux-package")
                .and_then(|task| task.get("args"))
        ),
        ["xtask", "build"]
    );
}

#[test]
fn test_signing_suspends_bitlocker_before_it_changes_the_boot_configuration() {
    let script = read(&scripts_dir().join("enable-test-signing.ps1"));
    let suspend = script
        .find("-MethodName 'DisableKeyProtectors' -Arguments @{ DisableCount = [uint32]1 }")
        .expect("enable-test-signing.ps1 suspends BitLocker for one boot");
    let guarded = script
        .find("if ($volume -and $volume.ProtectionStatus -eq 1) {")
        .expect("only when BitLocker protects the drive");
    let bcdedit = script
        .find("Invoke-Native -FilePath 'bcdedit.exe'")
        .expect("bcdedit");
    assert!(guarded < suspend && suspend < bcdedit);
}
