// `opqd-bench http`: runs scripts/bench-http.sh (bare C libmicrohttpd vs opqd, with wrk),
// found from the current directory or from this executable's location, with the `opqd`
// built next to this executable (OPQD_BIN) so the script does not rebuild.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

enum HTTPBench {
    static func findScript() -> String? {
        let rel = "scripts/bench-http.sh"
        var candidates = [FileManager.default.currentDirectoryPath + "/" + rel]
        var dir = BenchSupport.selfDirectory
        for _ in 0..<6 {
            candidates.append(dir + "/" + rel)
            dir = (dir as NSString).deletingLastPathComponent
        }
        return candidates.first { access($0, R_OK) == 0 }
    }

    static func main(_ args: [String]) -> Int32 {
        // Every argument (--quick, --duration, --connections, --rounds) is passed to the script.
        guard let script = findScript() else {
            eprint("opqd-bench http: scripts/bench-http.sh not found from \(FileManager.default.currentDirectoryPath) or \(BenchSupport.selfDirectory)\n")
            return 1
        }
        var env: [String: String] = [:]
        let opqd = BenchSupport.selfDirectory + "/opqd"
        if ProcessInfo.processInfo.environment["OPQD_BIN"] == nil, access(opqd, X_OK) == 0 { env["OPQD_BIN"] = opqd }
        do {
            let p = try ChildProcess(bench: ["bash", script] + args, stdoutPath: "-", stderrPath: nil, environment: env)
            guard let status = p.wait(timeout: 3600) else {
                p.stop()
                eprint("opqd-bench http: the script did not finish within an hour\n")
                return 1
            }
            return (status & 0x7f) == 0 ? (status >> 8) & 0xff : 1
        } catch {
            eprint("opqd-bench http: \(error)\n")
            return 1
        }
    }
}
