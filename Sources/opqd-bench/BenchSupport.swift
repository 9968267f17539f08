// The benchmarks' shared pieces, one concern a file: this one the namespace and the machine
// (directories, binaries, /proc); BenchSupport+Format.swift the report formatting; OpqdServer.swift
// an opqd child; Wrk.swift the wrk runs. HTTP clients, child processes and locks are TestKit's,
// the same the tests use.
import Dispatch
import Foundation
// TestKit (KeepAliveClient, ChildProcess, Locked, monotonicSeconds) for every file of the benchmarks.
@_exported import TestKit

#if canImport(Glibc)
import Glibc
#endif

enum BenchSupport {
    /// Monotonic seconds.
    static func now() -> Double { monotonicSeconds() }

    /// A fresh directory under `$TMPDIR` (or /tmp); exits when none can be made.
    static func makeTempDir(_ prefix: String) -> String {
        do {
            return try makeTemporaryDirectory(prefix: prefix)
        } catch {
            eprint("opqd-bench: cannot create a temporary directory: \(error)\n")
            exit(1)
        }
    }

    static func removeTree(_ path: String) {
        try? FileManager.default.removeItem(atPath: path)
    }

    /// Bytes used under `path` (files only, not following links).
    static func treeSize(_ path: String) -> Int {
        guard let e = FileManager.default.enumerator(atPath: path) else { return 0 }
        var total = 0
        while let f = e.nextObject() as? String {
            if let a = try? FileManager.default.attributesOfItem(atPath: path + "/" + f), let s = a[.size] as? NSNumber {
                total += s.intValue
            }
        }
        return total
    }

    /// The directory holding this executable.
    static var selfDirectory: String {
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        return (exe as NSString).deletingLastPathComponent
    }

    /// The `opqd` built next to this executable (same scratch dir, same configuration).
    static func opqdBinary() -> String {
        if let env = ProcessInfo.processInfo.environment["OPQD_BIN"], !env.isEmpty { return env }
        let p = selfDirectory + "/opqd"
        if access(p, X_OK) == 0 { return p }
        eprint("opqd-bench: no opqd next to this executable (\(p)); build it with --product opqd or set OPQD_BIN\n")
        exit(1)
    }

    /// A `/proc/PID/status` field in kB (`VmHWM`, `VmRSS`).
    static func statusKB(_ pid: pid_t, _ field: String) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
            let parts = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            if parts.count >= 2 { return Int(parts[1]) }
        }
        return nil
    }

    static func loadAverage() -> String {
        (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8))?.split(separator: " ").prefix(3).joined(separator: " ") ?? "?"
    }

    /// `uptime`-like context line for the report.
    static func machineLine() -> String {
        "machine: \(sysconf(Int32(_SC_NPROCESSORS_ONLN))) cores, load average \(loadAverage()) (before the run)"
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}
