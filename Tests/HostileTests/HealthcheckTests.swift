import Foundation
import Spawning
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `opqd healthcheck` and `opqd --help`, run as the real binary (as a container's HEALTHCHECK runs it).
@Suite("opqd healthcheck and --help")
struct HealthcheckTests {
    /// How one run of the binary ended.
    struct Run: CustomStringConvertible {
        let exit: ProcessExit?
        let stdout: String
        let stderr: String
        let seconds: Double
        var stderrLines: [Substring] { stderr.split(separator: "\n", omittingEmptySubsequences: false).dropLast() }
        var description: String {
            "\(exit?.description ?? "still running") after \(seconds) s; stdout: \(stdout.debugDescription); stderr: \(stderr.debugDescription)"
        }
    }

    /// Runs `opqd arguments` in an empty directory with this process's environment minus its
    /// `OPQD_*` settings, plus `environment`; kills it after `limit` seconds. Also returns what
    /// the run left in that directory (a healthcheck must leave nothing: no store, no data).
    static func opqd(_ arguments: [String], environment: [String: String] = [:], limit: Double = 20) throws -> (Run, leftBehind: [String]) {
        try withTemporaryDirectory(prefix: "opqd-healthcheck") { dir in
            var env = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("OPQD_") }
            env.merge(environment) { $1 }
            var request = SpawnRequest([try OpqdBinary.locate()] + arguments, environment: env.map { "\($0.key)=\($0.value)" }, directory: dir.path)
            let outputs = try TemporaryDirectory(prefix: "opqd-healthcheck-out")
            defer { outputs.remove() }
            request.stdout = .file(outputs.file("stdout"), append: false)
            request.stderr = .file(outputs.file("stderr"), append: false)
            let started = monotonicSeconds()
            let child = try ChildProcess(request)
            let status = child.wait(timeout: limit)
            let seconds = monotonicSeconds() - started
            if status == nil { child.killNow() }
            let read = { (name: String) in (try? String(contentsOfFile: outputs.file(name), encoding: .utf8)) ?? "" }
            let run = Run(exit: status.map(ProcessExit.init(status:)), stdout: read("stdout"), stderr: read("stderr"), seconds: seconds)
            let left = (try? FileManager.default.contentsOfDirectory(atPath: dir.path)) ?? []
            return (run, left)
        }
    }

    /// Checks a failed check: exit 1, exactly one line on stderr, containing every one of `words`.
    static func expectUnhealthy(_ run: Run, _ words: [String], sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(run.exit == .exited(1), "\(run)", sourceLocation: sourceLocation)
        #expect(run.stderrLines.count == 1, "one line on stderr: \(run)", sourceLocation: sourceLocation)
        for word in words {
            #expect(run.stderr.contains(word), "stderr should say \(word.debugDescription): \(run)", sourceLocation: sourceLocation)
        }
    }

    @Test("exits 0 against a running opqd: with --url, with the default URL on OPQD_PORT, and with a token set (/readyz is open)")
    func healthy() async throws {
        let plain = try Opqd()
        let guarded = try Opqd(["--token", "healthcheck-token-0123456789"])
        try await blocking {
            let (withURL, left) = try Self.opqd(["healthcheck", "--url", "http://127.0.0.1:\(plain.port)/readyz"])
            #expect(withURL.exit == .exited(0), "\(withURL)")
            #expect(withURL.stderr.isEmpty, "\(withURL)")
            #expect(left.isEmpty, "a healthcheck must create nothing (no store): \(left)")

            let (byPort, _) = try Self.opqd(["healthcheck"], environment: ["OPQD_PORT": "\(plain.port)"])
            #expect(byPort.exit == .exited(0), "default URL http://127.0.0.1:$OPQD_PORT/readyz: \(byPort)")

            let (tokened, _) = try Self.opqd(["healthcheck", "--timeout=2", "--url=http://127.0.0.1:\(guarded.port)/readyz"])
            #expect(tokened.exit == .exited(0), "a server with --token: \(tokened)")
        }
        plain.expectAlive("three healthchecks")
    }

    @Test("exits 1 promptly with one line saying why: connection refused, a 503 with the problem's detail, another status, a timeout")
    func unhealthy() async throws {
        let detail = "the server is shutting down"
        let problem = #"{"type":"https://opqd.dev/problems/not-ready","title":"Not ready","status":503,"detail":"\#(detail)"}"#
        let target = try HostileTarget { path in
            switch path {
            case "/readyz":
                return .raw(
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\nContent-Length: \(problem.utf8.count)\r\nConnection: close\r\n\r\n\(problem)"
                )
            case "/hang": return .hang(seconds: 60)
            default: return .raw("HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope")
            }
        }
        try await blocking {
            let port = closedPort()
            // With a 30 s timeout, so that waiting for it stands far apart from a loaded machine's
            // slow process start (the default 3 s left no margin: a run's own start-up counts).
            let (refused, left) = try Self.opqd(["healthcheck", "--timeout", "30", "--url", "http://127.0.0.1:\(port)/readyz"])
            Self.expectUnhealthy(refused, ["connection-refused", "\(port)"])
            #expect(refused.seconds < 15, "connection refused must not wait for the 30 s timeout: \(refused)")
            #expect(left.isEmpty, "a healthcheck must create nothing: \(left)")

            // The default URL on a port nothing listens on: the check, not a server start.
            let (byPort, _) = try Self.opqd(["healthcheck"], environment: ["OPQD_PORT": "\(port)"])
            Self.expectUnhealthy(byPort, ["connection-refused", "127.0.0.1:\(port)/readyz"])

            let (notReady, _) = try Self.opqd(["healthcheck", "--url", target.url("/readyz")])
            Self.expectUnhealthy(notReady, ["503", detail])

            let (missing, _) = try Self.opqd(["healthcheck", "--url", target.url("/elsewhere")])
            Self.expectUnhealthy(missing, ["404"])

            let (slow, _) = try Self.opqd(["healthcheck", "--timeout", "0.5", "--url", target.url("/hang")])
            Self.expectUnhealthy(slow, ["timeout"])
            // How long the check held the hanging request, as the target saw it: the check's own
            // wait, without its process start-up (which a loaded machine stretches). About half a
            // second; the default 3 s timeout, or none, would be 3 s or the target's 60 s.
            let held = target.held.filter { $0.path == "/hang" }.map(\.seconds)
            #expect(held.count == 1, "the check should have asked /hang once and gone away: \(held) \(target.requests)")
            #expect(held.allSatisfy { $0 < 2.5 }, "--timeout 0.5 must end the check in about half a second; it held the request \(held) s: \(slow)")
            #expect(slow.seconds < 15, "the check must end at its timeout, not wait for the target's 60 s: \(slow)")
        }
    }

    @Test("a bad --timeout, --url, OPQD_PORT or option exits 2 with one line naming it")
    func badOptions() async throws {
        try await blocking {
            for value in ["nan", "NaN", "-1", "0", "-0.5", "inf", "1e400", "301", "86400", "abc", ""] {
                let (run, _) = try Self.opqd(["healthcheck", "--timeout", value, "--url", "http://127.0.0.1:9/readyz"])
                #expect(run.exit == .exited(2), "--timeout \(value.debugDescription): \(run)")
                #expect(run.stderrLines.count == 1 && run.stderr.contains("--timeout"), "--timeout \(value.debugDescription): \(run)")
            }
            let cases: [([String], [String: String], String)] = [
                (["healthcheck", "--timeout"], [:], "--timeout"),
                (["healthcheck", "--url"], [:], "--url"),
                (["healthcheck", "--url", "ftp://127.0.0.1/readyz"], [:], "--url"),
                (["healthcheck", "--url", "not a url"], [:], "--url"),
                (["healthcheck", "--url="], [:], "--url"),
                (["healthcheck", "--port", "8080"], [:], "--port"),
                (["healthcheck", "extra"], [:], "extra"),
                (["healthcheck"], ["OPQD_PORT": "0"], "OPQD_PORT"),
                (["healthcheck"], ["OPQD_PORT": "eighty"], "OPQD_PORT"),
            ]
            for (arguments, environment, word) in cases {
                let (run, _) = try Self.opqd(arguments, environment: environment)
                #expect(run.exit == .exited(2), "\(arguments) \(environment): \(run)")
                #expect(run.stderrLines.count == 1 && run.stderr.contains(word), "\(arguments) \(environment): \(run)")
            }
        }
    }

    /// Every `Option(flag: "--x", env: "OPQD_X", …)` of the options table in Configuration.swift,
    /// read from the source so the help text is checked against the table, not against itself.
    static func optionsTable() throws -> [(flag: String, env: String)] {
        let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Sources/QueueAPI/Configuration.swift")
        let text = try String(contentsOf: source, encoding: .utf8)
        let pattern = try NSRegularExpression(pattern: #"flag:\s*"(--[a-z0-9-]+)",\s*env:\s*"(OPQD_[A-Z0-9_]+)""#)
        return pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)).map { m in
            (String(text[Range(m.range(at: 1), in: text)!]), String(text[Range(m.range(at: 2), in: text)!]))
        }
    }

    @Test("opqd --help lists every option of the table with its variable and default, and the healthcheck subcommand with its options")
    func help() async throws {
        let table = try Self.optionsTable()
        #expect(table.count >= 29, "the options table as read from Configuration.swift: \(table)")
        try await blocking {
            let (run, left) = try Self.opqd(["--help"])
            #expect(run.exit == .exited(0), "\(run)")
            #expect(left.isEmpty, "--help must create nothing: \(left)")
            let lines = run.stdout.split(separator: "\n")
            for (flag, env) in table {
                let line = lines.first { $0.split(separator: " ").first.map(String.init) == flag }
                #expect(line?.contains(env) == true, "--help should list \(flag) with \(env): \(line.map(String.init) ?? "no line")")
                #expect(line?.lowercased().contains("default") == true, "--help should give \(flag)'s default: \(line.map(String.init) ?? "no line")")
            }
            for word in ["opqd healthcheck", "--url", "--timeout", "/readyz", "OPQD_PORT", "--help"] {
                #expect(run.stdout.contains(word), "--help should mention \(word)")
            }
            let (sub, _) = try Self.opqd(["healthcheck", "--help"])
            #expect(sub.exit == .exited(0) && sub.stdout.contains("opqd healthcheck"), "healthcheck --help: \(sub)")
        }
    }
}
