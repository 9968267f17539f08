// The benchmarks' way of starting TestKit's ChildProcess.
import Foundation
import Spawning

extension ChildProcess {
    /// Starts `argv` (looked up in PATH). `stdoutPath`: nil = a pipe (read with `readLine`),
    /// "-" = inherited, else a file (truncated). `stderrPath`: nil = inherited, else a file.
    /// `environment` is added to this process's own.
    convenience init(bench argv: [String], stdoutPath: String?, stderrPath: String?, environment: [String: String] = [:]) throws {
        let env = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        var request = SpawnRequest(argv, environment: env.map { "\($0.key)=\($0.value)" })
        request.searchPath = true
        request.stdout = stdoutPath.map { $0 == "-" ? .inherit : .file($0, append: false) } ?? .pipe
        request.stderr = stderrPath.map { .file($0, append: false) } ?? .inherit
        try self.init(request)
    }

    /// It exited with status 0 (waits for it).
    var exitedNormally: Bool { exitCode == 0 }
}
