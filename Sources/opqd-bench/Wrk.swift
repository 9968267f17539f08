// wrk runs (`store`) and the parsing of wrk's report.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

struct WrkResult {
    var requests = 0
    var seconds = 0.0
    var rps = 0.0
    var non2xx = 0
    var socketErrors = ""
    var p50ms = 0.0
    var p99ms = 0.0
    var raw = ""
    /// Answers wrk saw that were 2xx (for a create: acknowledged creates).
    var ok: Int { requests - non2xx }
}

enum Wrk {
    static func ensureInstalled() -> Bool {
        if access("/usr/bin/wrk", X_OK) == 0 || access("/usr/local/bin/wrk", X_OK) == 0 { return true }
        eprint("opqd-bench: wrk is not installed; run scripts/deps.sh bench (Debian package wrk)\n")
        return false
    }

    /// Runs wrk; `lua` is the script's text (written to a temp file).
    static func run(url: String, connections: Int, seconds: Int, threads: Int = 2, lua: String? = nil) throws -> WrkResult {
        let dir = BenchSupport.makeTempDir("opqd-bench-wrk")
        defer { BenchSupport.removeTree(dir) }
        var argv = ["wrk", "-t\(min(threads, connections))", "-c\(connections)", "-d\(seconds)s", "--latency", "--timeout", "10s"]
        if let lua {
            try lua.write(toFile: dir + "/script.lua", atomically: true, encoding: .utf8)
            argv += ["-s", dir + "/script.lua"]
        }
        argv.append(url)
        let p = try ChildProcess(bench: argv, stdoutPath: dir + "/out.txt", stderrPath: dir + "/err.txt")
        guard let status = p.wait(timeout: Double(seconds) + 60) else {
            p.killNow()
            throw BenchError("wrk did not finish in time")
        }
        let text = (try? String(contentsOfFile: dir + "/out.txt", encoding: .utf8)) ?? ""
        guard status == 0 else {
            let err = (try? String(contentsOfFile: dir + "/err.txt", encoding: .utf8)) ?? ""
            throw BenchError("wrk failed (status \(status)): \(text)\(err)")
        }
        return parse(text)
    }

    static func ms(_ s: Substring) -> Double {
        let units: [(String, Double)] = [("us", 0.001), ("ms", 1), ("s", 1000), ("m", 60_000)]
        for (u, f) in units where s.hasSuffix(u) {
            if let v = Double(s.dropLast(u.count)) { return v * f }
        }
        return Double(s) ?? 0
    }

    static func parse(_ text: String) -> WrkResult {
        var r = WrkResult()
        r.raw = text
        for line in text.split(separator: "\n") {
            let t = line.trimmingCharacters(in: .whitespaces)
            let w = t.split(separator: " ", omittingEmptySubsequences: true)
            if t.contains("requests in"), let n = Int(w.first ?? "") {
                r.requests = n
                if w.count > 3 { r.seconds = ms(w[3].hasSuffix(",") ? w[3].dropLast() : w[3]) / 1000 }
            } else if t.hasPrefix("Requests/sec:"), w.count >= 2 {
                r.rps = Double(w[1]) ?? 0
            } else if t.hasPrefix("Non-2xx or 3xx responses:"), let n = Int(w.last ?? "") {
                r.non2xx = n
            } else if t.hasPrefix("Socket errors:") {
                r.socketErrors = String(t.dropFirst("Socket errors: ".count))
            } else if t.hasPrefix("50%"), w.count >= 2 {
                r.p50ms = ms(w[1])
            } else if t.hasPrefix("99%"), w.count >= 2 {
                r.p99ms = ms(w[1])
            }
        }
        return r
    }
}
