//! Every shell example of README.md and docs/ runs as written, so a doc that drifts fails.
//!
//! Each ```` ```sh ```` block is preceded by a directive:
//!
//! - `<!-- example: run; expect: TEXT; expect: TEXT … -->`: the block runs with `bash` in a
//!   fresh directory that holds the repository's folders (so `crates/…`, `deploy/…` resolve)
//!   and the files the same page names in a code block starting `# NAME.EXT`; `weir` and
//!   `envoy` are on the `PATH`. Before each command that is not sent to the background, the
//!   ports the block mentions must accept connections (a reader types slower than a script).
//!   Its output must contain every TEXT; at the end its background processes are stopped.
//! - `<!-- example: checked by FILE (what) -->`: a test of FILE runs the example.
//! - `<!-- example: not run: REASON -->`.
//!
//! A block without a directive fails the test. A command the prose tells a reader to run
//! (inline `weir …` or `curl …` with two options or more and no placeholder) must appear in a
//! block that runs or is checked, on any page. The examples use fixed ports (8000, 8080, 8081,
//! 9000, 10000): they run one after another in this one test.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A shell example and what to do with it.
struct Example {
    page: PathBuf,
    line: usize,
    directive: String,
    script: String,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The code blocks of a page: (line of the fence, info string, directive before it, text).
fn blocks(text: &str) -> Vec<(usize, String, String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            let indent = lines[i].len() - trimmed.len();
            let start = i;
            let directive = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim())
                .filter(|l| l.starts_with("<!-- example:"))
                .unwrap_or("")
                .to_string();
            let mut body = String::new();
            i += 1;
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                body.push_str(lines[i].get(indent..).unwrap_or(lines[i].trim_start()));
                body.push('\n');
                i += 1;
            }
            out.push((start + 1, info.trim().to_string(), directive, body));
        }
        i += 1;
    }
    out
}

/// The ports a script mentions (the examples' fixed ports).
fn ports(script: &str) -> Vec<u16> {
    let mut out: Vec<u16> = script
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u16>().ok())
        .filter(|p| matches!(p, 8000 | 8080 | 8081 | 9000 | 9901 | 10000))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The script with a wait for `ports` before every foreground command once a server was
/// started in the background (none inside a here-document, whose lines are text).
fn with_waits(script: &str, ports: &[u16]) -> String {
    let list: Vec<String> = ports.iter().map(u16::to_string).collect();
    let mut out = String::from(
        "__wait() { for p in \"$@\"; do for _ in $(seq 300); do (echo > /dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done; done; }\n",
    );
    let (mut started, mut heredoc): (bool, Option<String>) = (false, None);
    for line in script.lines() {
        if let Some(end) = &heredoc {
            if line.trim() == end {
                heredoc = None;
            }
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let code = line.split(" #").next().unwrap_or("").trim();
        if started
            && !code.is_empty()
            && !code.starts_with('#')
            && !code.ends_with('&')
            && !list.is_empty()
        {
            out.push_str(&format!("__wait {}\n", list.join(" ")));
        }
        started |= code.ends_with('&');
        if let Some((_, tag)) = code.split_once("<<") {
            heredoc = Some(tag.trim().trim_matches(['\'', '"', '-']).to_string());
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn examples() -> Vec<Example> {
    let mut out = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, info, directive, script) in blocks(&text) {
            if info == "sh" {
                out.push(Example {
                    page: page.clone(),
                    line,
                    directive,
                    script,
                });
            }
        }
    }
    out
}

/// A directory with the repository's folders and `page`'s named files.
fn workdir(page: &Path, n: usize) -> PathBuf {
    let dir = common::tempdir(&format!("doc-example-{n}"));
    for name in ["crates", "deploy", "docs", "proto", "scripts", "bench"] {
        let _ = std::os::unix::fs::symlink(repo().join(name), dir.join(name));
    }
    let text = std::fs::read_to_string(page).unwrap();
    for (_, _, _, body) in blocks(&text) {
        let first = body.lines().next().unwrap_or("");
        if let Some(name) = first.strip_prefix("# ") {
            let name = name.trim();
            if !name.contains(' ') && name.contains('.') && !name.contains('/') {
                std::fs::write(dir.join(name), &body).unwrap();
            }
        }
    }
    dir
}

fn run(example: &Example, n: usize) -> Result<(), String> {
    let dir = workdir(&example.page, n);
    let weir_dir = Path::new(env!("CARGO_BIN_EXE_weir")).parent().unwrap();
    let envoy = common::envoy_bin();
    let path = format!(
        "{}:{}:{}",
        weir_dir.display(),
        envoy.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = with_waits(&example.script, &ports(&example.script));
    let out_file = dir.join("output.txt");
    let child = Command::new("setsid")
        .args(["bash", "-c", &script])
        .current_dir(&dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file).unwrap())
        .stderr(std::fs::File::create(dir.join("errors.txt")).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut child = child;
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Stop what the example left running in the background (its process group).
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
    let _ = child.wait();
    std::thread::sleep(Duration::from_millis(300));
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
    let output = std::fs::read_to_string(&out_file).unwrap_or_default();
    let errors = std::fs::read_to_string(dir.join("errors.txt")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let context = || format!("output:\n{output}\nerrors:\n{errors}");
    match status {
        None => return Err(format!("did not finish within 90 s; {}", context())),
        Some(s) if !s.success() => return Err(format!("exited with {s}; {}", context())),
        Some(_) => {}
    }
    for expect in example
        .directive
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("expect:"))
    {
        let expect = expect.trim().trim_end_matches("-->").trim();
        if !output.contains(expect) {
            return Err(format!("expected {expect:?}; {}", context()));
        }
    }
    Ok(())
}

#[test]
fn every_shell_example_of_the_docs_runs_as_written() {
    let all = examples();
    assert!(all.len() >= 8, "{} shell examples found", all.len());
    let mut failures = Vec::new();
    let mut ran = 0;
    for (n, e) in all.iter().enumerate() {
        let at = format!(
            "{}:{}",
            e.page.strip_prefix(repo()).unwrap_or(&e.page).display(),
            e.line
        );
        let directive = e
            .directive
            .trim_start_matches("<!-- example:")
            .trim_end_matches("-->")
            .trim();
        if directive.starts_with("run") {
            ran += 1;
            if let Err(why) = run(e, n) {
                failures.push(format!("{at}: {why}"));
            }
        } else if let Some(by) = directive.strip_prefix("checked by ") {
            let file = by.split_whitespace().next().unwrap_or("");
            if !repo().join(file).is_file() {
                failures.push(format!("{at}: checked by {file}, which does not exist"));
            }
        } else if directive
            .strip_prefix("not run:")
            .is_none_or(|r| r.trim().is_empty())
        {
            failures.push(format!(
                "{at}: no `<!-- example: run | checked by FILE | not run: REASON -->` before the block"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!("{ran} shell examples ran as written");
}

/// The commands a page's prose tells a reader to run: inline code (outside fenced blocks)
/// starting `weir ` or `curl ` with two options or more and no placeholder (`FILE`, `…`,
/// `[--opt]`), whitespace normalised, with their lines.
fn inline_commands(text: &str) -> Vec<(usize, String)> {
    let mut prose = String::with_capacity(text.len());
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
        }
        prose.push('\n');
    }
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    let mut offset = 0;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        let span = &after[..close];
        let words: Vec<&str> = span.split_whitespace().collect();
        let options = words.iter().filter(|w| w.starts_with('-')).count();
        let placeholder = span.contains('…')
            || span.contains("...")
            || span.contains('[')
            || span
                .as_bytes()
                .windows(2)
                .any(|w| w[0].is_ascii_uppercase() && w[1].is_ascii_uppercase());
        if matches!(words.first(), Some(&"weir" | &"curl")) && options >= 2 && !placeholder {
            let line = prose[..offset + open].matches('\n').count() + 1;
            out.push((line, words.join(" ")));
        }
        offset += open + 1 + close + 1;
        rest = &after[close + 1..];
    }
    out
}

#[test]
fn commands_in_the_prose_are_shown_in_examples_that_run() {
    assert_eq!(
        inline_commands(
            "Run `weir proxy --rules llm.yaml --upstream http://127.0.0.1:8000` now;\n`weir serve`, `weir proxy --rules FILE --upstream URL`.\n```sh\nweir x --a --b\n```\n"
        ),
        [(
            1,
            "weir proxy --rules llm.yaml --upstream http://127.0.0.1:8000".to_string()
        )]
    );
    // Every block the docs test runs or a test checks, on any page.
    let mut running: Vec<String> = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        running.extend(
            blocks(&text)
                .into_iter()
                .filter(|(_, info, directive, _)| {
                    info == "sh"
                        && (directive.starts_with("<!-- example: run")
                            || directive.starts_with("<!-- example: checked by"))
                })
                .map(|(_, _, _, body)| body.split_whitespace().collect::<Vec<_>>().join(" ")),
        );
    }
    let mut missing = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, command) in inline_commands(&text) {
            if !running.iter().any(|b| b.contains(&command)) {
                let page = page
                    .strip_prefix(repo())
                    .unwrap_or(&page)
                    .display()
                    .to_string();
                missing.push(format!("{page}:{line}: `{command}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "commands the prose tells a reader to run, in no block that the docs test runs or a test checks:\n{}",
        missing.join("\n")
    );
}
