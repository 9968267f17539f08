import Foundation
import Locking
import Spawning
import TestKit

#if canImport(Glibc)
import Glibc
#endif

/// One real `opqd` process of a test cluster, started with `--store <database> --port 0`.
///
/// Unlike TestKit's `ServerProcess`, its stdout is read for as long as it lives: an owner that
/// lost its lease re-executes itself as a follower (same pid) and prints its listening line
/// again, maybe with another port; `port` is always the latest one.
final class ClusterNode: @unchecked Sendable {  // mutable state only behind `state`
    let index: Int
    /// The address it listens on (127.0.0.1, or its network namespace's).
    let host: String
    let pid: pid_t
    let logPath: String
    let startupSeconds: Double

    private struct State {
        var ports: [Int] = []
        var exit: ProcessExit?
    }
    private let state = Lock(State())

    /// Starts `binary --host <host> --port 0 --data <unused dir> --log-level info <arguments>`
    /// (after `launcher`, e.g. `ip netns exec NS`, which execs it: the pid is opqd's) and waits
    /// (up to `timeout`) for its listening line. The child gets this process's environment
    /// without its OPQD_* settings.
    init(
        index: Int, binary: String, arguments: [String], data: String, logPath: String, timeout: Double = 30, host: String = "127.0.0.1",
        launcher: [String] = []
    ) throws {
        self.index = index
        self.host = host
        self.logPath = logPath
        let argv = launcher + [binary, "--host", host, "--port", "0", "--data", data, "--log-level", "info"] + arguments
        let environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("OPQD_") }
        var request = SpawnRequest(argv, environment: environment.map { "\($0.key)=\($0.value)" })
        request.stdout = .pipe
        request.stderr = .file(logPath, append: true)
        let started = monotonicSeconds()
        let child: SpawnedProcess
        do { child = try Spawner.spawn(request) } catch { throw TestClientError("cannot run \(binary): \(error)") }
        guard let stdout = child.stdout else { throw TestClientError("no pipe for \(binary)'s stdout") }
        pid = child.pid
        // Reads stdout until EOF (the process and every exec of it are gone).
        let reader = Thread { [state] in
            var pending: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 1024)
            while true {
                let n = read(stdout, &chunk, chunk.count)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                pending += chunk[..<n]
                while let nl = pending.firstIndex(of: 0x0A) {
                    let line = String(decoding: pending[..<nl], as: UTF8.self)
                    pending.removeFirst(nl + 1)
                    if line.hasPrefix("opqd listening on http://"), let colon = line.lastIndex(of: ":"),
                        let port = Int(line[line.index(after: colon)...])
                    {
                        state.withLock { $0.ports.append(port) }
                    }
                }
            }
            close(stdout)
        }
        reader.stackSize = 1 << 18
        reader.start()
        let listening = waitUntil(timeout: timeout, every: 0.01) { [state] in !state.withLock { $0.ports.isEmpty } }
        startupSeconds = monotonicSeconds() - started
        guard listening else {
            Glibc.kill(pid, SIGKILL)
            _ = waitForExit(timeout: 10)
            throw TestClientError("opqd #\(index) printed no listening line within \(timeout) s; log:\n\(logTail())")
        }
    }

    deinit {
        if waitForExit(timeout: 0) == nil {
            Glibc.kill(pid, SIGKILL)
            _ = waitForExit(timeout: 10)
        }
    }

    /// The port of its latest listening line.
    var port: Int { state.withLock { $0.ports.last ?? 0 } }
    /// How many listening lines it printed (one per exec).
    var listeningLines: Int { state.withLock { $0.ports.count } }
    /// Every port it listened on, in order (one per exec).
    var ports: [Int] { state.withLock { $0.ports } }
    var url: String { "http://\(host):\(port)" }

    /// Sends `signal` unless the process has been reaped.
    func signal(_ signal: Int32) {
        state.withLock { s in
            if s.exit == nil { Glibc.kill(pid, signal) }
        }
    }

    /// Waits (polling) until the process ends, up to `timeout` seconds; reaps it.
    @discardableResult
    func waitForExit(timeout: Double) -> ProcessExit? {
        let deadline = monotonicSeconds() + timeout
        while true {
            let result: ProcessExit? = state.withLock { s in
                if let e = s.exit { return e }
                var status: Int32 = 0
                guard waitpid(pid, &status, WNOHANG) == pid else { return nil }
                s.exit = ProcessExit(status: status)
                return s.exit
            }
            if let result { return result }
            if monotonicSeconds() >= deadline { return nil }
            usleep(2_000)
        }
    }

    /// Not exited (and not reaped).
    var isRunning: Bool { waitForExit(timeout: 0) == nil }

    /// SIGKILL, then reap.
    func killNow() {
        signal(SIGKILL)
        waitForExit(timeout: 30)
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace` seconds.
    func stop(grace: Double = 10) {
        signal(SIGCONT)
        signal(SIGTERM)
        if waitForExit(timeout: grace) == nil { killNow() }
    }

    /// The tail of its stderr.
    func logTail(_ count: Int = 3000) -> String {
        String(((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "").suffix(count))
    }

    /// Whether `/readyz` answers 200 within `timeout` seconds.
    func isReady(timeout: Double = 1) -> Bool {
        (try? request("GET", "/readyz", timeout: timeout))?.status == 200
    }

    /// One request on a fresh connection; never throws, says what happened.
    func exchange(_ method: String, _ target: String, json: String? = nil, headers: [String: String] = [:], timeout: Double = 10) -> HTTPOutcome {
        HTTPExchange.run(host: host, port: port, method: method, path: target, body: json.map { Array($0.utf8) }, headers: headers, timeout: timeout)
    }

    /// One request; throws unless a complete answer came.
    func request(_ method: String, _ target: String, json: String? = nil, headers: [String: String] = [:], timeout: Double = 10) throws -> TestResponse {
        let outcome = exchange(method, target, json: json, headers: headers, timeout: timeout)
        guard let r = outcome.response else { throw TestClientError("opqd #\(index) (pid \(pid)): \(method) \(target): \(outcome)") }
        return r
    }

    /// Its own entry of `GET /v1/cluster` (nil if it did not answer 200): whether it says it
    /// owns the queues, and the whole answer. In `mode: single` the one instance owns them all.
    func clusterView(timeout: Double = 3) -> (owner: Bool, answer: [String: Any])? {
        guard let r = exchange("GET", "/v1/cluster", timeout: timeout).response, r.status == 200 else { return nil }
        let instances = r.objects("instances")
        guard let me = instances.first(where: { $0["self"] as? Bool == true }) else { return nil }
        let owner = (me["owner"] as? Bool) ?? (r.string("mode") == "single")
        return (owner, r.object)
    }
}
