import Foundation
import QueueEngine

#if canImport(Glibc)
import Glibc
#endif

/// Identifies a process across a server restart: pid, start time (clock ticks after boot,
/// from /proc/PID/stat) and the boot id, so a reused pid is never mistaken for it.
struct ProcessIdentity: Equatable {
    var pid: pid_t
    var startTicks: UInt64
    var boot: String

    init?(pid: pid_t) {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return nil }
        // Fields after the command name: state is field 3, starttime field 22.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 19, let start = UInt64(fields[19]) else { return nil }
        let boot = (try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8)) ?? ""
        self.pid = pid
        self.startTicks = start
        self.boot = boot.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    init?(json: JSONValue) {
        // Saved by this kind, but read back from the store: any number may come back.
        guard case let .number(p)? = json["pid"], case let .number(s)? = json["startTicks"],
            // pid >= 2 and whole: pid_t(0.5) is 0 and recover's kill(-pid) of 0 or -1 would
            // signal our own process group or every process.
            case let .string(b)? = json["bootId"], p >= 2, p < Double(Int32.max), p == p.rounded(),
            s >= 0, s < 18_446_744_073_709_551_616.0
        else { return nil }
        pid = pid_t(p)
        startTicks = UInt64(s)
        boot = b
    }

    var json: JSONValue {
        .object([("pid", .number(Double(pid))), ("startTicks", .number(Double(startTicks))), ("bootId", .string(boot))])
    }
}
