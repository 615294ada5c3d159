//! The documented curl session (docs/HTTP.md, section "The example service"; the README points
//! to it) is what the example service really answers: each `$ curl ...` command of that block is
//! parsed from docs/HTTP.md, sent the way curl sends it to `examples/edge_service/` running in a
//! child process on a fresh data directory, and rendered the way curl prints it (`-i`: status
//! line, headers, a blank line, the body; otherwise the body alone). `$ kill -TERM $PID` sends
//! SIGTERM and renders what the service prints on stderr. The rendered block must equal the
//! document's, byte for byte, except for the response headers in [`HEADERS_LEFT_OUT`] (the
//! document says it leaves them out). On a mismatch the test prints the block the service
//! produced, to paste into docs/HTTP.md.
#![cfg(all(feature = "http", unix))]

use crate::edge_example;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// Response headers the documented transcript does not show: `date` changes on every run, and
/// `content-length` is noise next to the body it counts. Every other header is shown, in the
/// order the service sends it.
const HEADERS_LEFT_OUT: &[&str] = &["date", "content-length"];

/// The address every command of the block names: the example's default `--listen`.
const DOC_ADDR: &str = "localhost:8080";

/// How long a `GET` may take to show what the document shows (the outbox dispatcher publishes
/// asynchronously, so "already published" may need a moment after the POST).
const SETTLE: Duration = Duration::from_secs(10);

/// The documented curl block: the first ```text fence after the heading of docs/HTTP.md's
/// section on the example service whose first line is a curl command.
fn documented_block() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/HTTP.md");
    let doc = std::fs::read_to_string(path).expect("docs/HTTP.md is readable");
    let section = doc
        .find("## The example service")
        .expect("docs/HTTP.md has the section on the example service");
    let mut rest = &doc[section..];
    loop {
        let start = rest
            .find("```text\n")
            .expect("the HTTP section has a ```text block starting with `$ curl`")
            + "```text\n".len();
        let len = rest[start..].find("```").expect("the block is closed");
        let block = &rest[start..start + len];
        if block.starts_with("$ curl ") {
            return block.to_owned();
        }
        rest = &rest[start + len + 3..];
    }
}

/// One `$ ...` command of the block: its lines as written, its words, and the output shown
/// under it.
struct Step {
    command: Vec<String>,
    words: Vec<String>,
    shown: String,
}

fn steps(block: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut lines = block.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(first) = line.strip_prefix("$ ") else {
            let step = steps
                .last_mut()
                .unwrap_or_else(|| panic!("output before the first command: {line:?}"));
            step.shown.push_str(line);
            step.shown.push('\n');
            continue;
        };
        let mut command = vec![line.to_owned()];
        let mut text = first.to_owned();
        while text.ends_with('\\') {
            text.pop();
            let next = lines.next().expect("a continued command goes on");
            command.push(next.to_owned());
            text.push_str(next);
        }
        steps.push(Step {
            command,
            words: shell_words(&text),
            shown: String::new(),
        });
    }
    for step in &mut steps {
        step.shown = step.shown.trim_end_matches('\n').to_owned();
    }
    steps
}

/// The words of a shell command line as sh splits them: single and double quotes, and a `#`
/// starting a word begins a comment. (Enough for the document; no variables, no escapes.)
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            '#' if word.is_none() => break,
            '\'' | '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some(q) if q == c => break,
                        Some(other) => w.push(other),
                        None => panic!("unterminated quote in {line:?}"),
                    }
                }
            }
            other => word.get_or_insert_with(String::new).push(other),
        }
    }
    words.extend(word);
    words
}

/// A curl command line of the document: what it sends and how it prints.
struct Curl {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    data: Option<String>,
    include_headers: bool,
}

fn parse_curl(words: &[String]) -> Curl {
    assert_eq!(words[0], "curl");
    let mut method = None;
    let mut url = None;
    let mut headers = Vec::new();
    let mut data = None;
    let mut include_headers = false;
    let mut args = words[1..].iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| panic!("curl {arg} needs a value"))
                .clone()
        };
        match arg.as_str() {
            "-s" => {}
            "-i" | "-si" | "-is" => include_headers = true,
            "-X" => method = Some(value()),
            "-H" => {
                let h = value();
                let (name, v) = h.split_once(':').expect("-H 'Name: value'");
                headers.push((name.to_owned(), v.trim_start().to_owned()));
            }
            "-d" => data = Some(value()),
            flag if flag.starts_with('-') => {
                panic!("curl option {flag} is not understood by this test: teach it, or drop it")
            }
            _ => {
                assert!(url.is_none(), "one URL per command: {words:?}");
                url = Some(arg.clone());
            }
        }
    }
    let url = url.expect("a URL");
    let path = url
        .strip_prefix(DOC_ADDR)
        .unwrap_or_else(|| panic!("{url}: the documented commands talk to {DOC_ADDR}"));
    let method = method.unwrap_or_else(|| if data.is_some() { "POST" } else { "GET" }.into());
    Curl {
        method,
        path: path.to_owned(),
        headers,
        data,
        include_headers,
    }
}

/// Sends `curl` to `addr` as curl sends it (its default `Host`, `User-Agent` and `Accept`
/// headers, each replaced by a `-H` of the same name; `-d` adds a form content type unless one
/// is given) and returns what curl prints, minus the [`HEADERS_LEFT_OUT`].
fn run_curl(addr: SocketAddr, curl: &Curl) -> String {
    let mut headers: Vec<(String, String)> = vec![
        ("Host".into(), DOC_ADDR.into()),
        ("User-Agent".into(), "curl/8.5.0".into()),
        ("Accept".into(), "*/*".into()),
    ];
    for (name, value) in &curl.headers {
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        headers.push((name.clone(), value.clone()));
    }
    if let Some(data) = &curl.data {
        headers.push(("Content-Length".into(), data.len().to_string()));
        if !headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        {
            headers.push((
                "Content-Type".into(),
                "application/x-www-form-urlencoded".into(),
            ));
        }
    }
    let mut request = format!("{} {} HTTP/1.1\r\n", curl.method, curl.path);
    for (name, value) in &headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(curl.data.as_deref().unwrap_or(""));

    let mut stream = TcpStream::connect_timeout(&addr, SETTLE).unwrap();
    stream.set_read_timeout(Some(SETTLE)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end_matches(['\r', '\n']).to_owned();
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    let length: usize = head
        .iter()
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no content-length in {head:?}"));
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let body = String::from_utf8(body).unwrap();
    if !curl.include_headers {
        return body;
    }
    let mut out = String::new();
    for (i, line) in head.iter().enumerate() {
        let left_out = i > 0
            && line.split_once(':').is_some_and(|(n, _)| {
                HEADERS_LEFT_OUT
                    .iter()
                    .any(|left| n.eq_ignore_ascii_case(left))
            });
        if !left_out {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push('\n');
    out.push_str(&body);
    out
}

#[test]
fn the_documented_curl_session_is_what_the_example_service_answers() {
    let block = documented_block();
    let steps = steps(&block);
    let curls = steps
        .iter()
        .filter(|s| s.words.first().is_some_and(|w| w == "curl"));
    assert!(
        curls.count() >= 5,
        "the documented session has its curl commands"
    );

    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr, mut stderr) = edge_example::spawn(dir.path(), &[]);
    let mut produced = String::new();
    let mut mismatches = Vec::new();
    for step in &steps {
        let output = match step.words.first().map(String::as_str) {
            // A comment line: nothing runs, nothing is printed.
            None => String::new(),
            Some("curl") => {
                let curl = parse_curl(&step.words);
                let deadline = Instant::now() + SETTLE;
                loop {
                    let out = run_curl(addr, &curl);
                    // Only a read is asked again: the outbox dispatcher runs on its own time.
                    if out == step.shown || curl.method != "GET" || Instant::now() > deadline {
                        break out;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Some("kill") => {
                assert_eq!(step.words, ["kill", "-TERM", "$PID"]);
                let status = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status()
                    .unwrap();
                assert!(status.success());
                let lines: Vec<String> = stderr.by_ref().map_while(Result::ok).collect();
                let exit = child.wait().unwrap();
                assert!(exit.success(), "the service stops cleanly: {exit:?}");
                lines.join("\n")
            }
            Some(other) => panic!("the documented session runs `{other}`: teach this test"),
        };
        for line in &step.command {
            produced.push_str(line);
            produced.push('\n');
        }
        if !output.is_empty() {
            produced.push_str(&output);
            produced.push('\n');
        }
        if output != step.shown {
            mismatches.push(format!(
                "{}\n--- docs/HTTP.md shows:\n{}\n--- the service printed:\n{output}",
                step.command.join("\n"),
                step.shown
            ));
        }
        // Steps with output are set apart by a blank line, as in the document.
        if !step.shown.is_empty() || !output.is_empty() {
            produced.push('\n');
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    println!("{produced}");
    assert!(
        mismatches.is_empty(),
        "docs/HTTP.md's curl session differs from what the service answers:\n\n{}\n\nThe whole \
         block as the service answers it:\n```text\n{produced}```",
        mismatches.join("\n\n")
    );
    // The rendering above is the document's block itself (commands, outputs, blank lines), so a
    // block pasted from a failure message passes.
    assert_eq!(produced.trim_end(), block.trim_end());
}
