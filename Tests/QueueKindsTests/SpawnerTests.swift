import Foundation
import Spawning
import Testing

extension KindsTests {
    /// The one `posix_spawn` wrapper (module Spawning, on CSystem), exercised with real children:
    /// what CommandKind, the tests' ChildProcess/ServerProcess and the benchmarks rely on.
    @Suite struct Spawner {
        /// Runs `request` with stdout on a pipe; returns the output and the raw wait status.
        func run(_ request: SpawnRequest) throws -> (output: String, status: Int32) {
            var request = request
            request.stdout = .pipe
            let child = try Spawning.Spawner.spawn(request)
            let out = try #require(child.stdout)
            var bytes: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let n = read(out, &buffer, buffer.count)
                if n > 0 { bytes += buffer[..<n]; continue }
                if n < 0 && errno == EINTR { continue }
                break
            }
            close(out)
            var status: Int32 = 0
            while waitpid(child.pid, &status, 0) < 0 && errno == EINTR {}
            return (String(decoding: bytes, as: UTF8.self), status)
        }

        @Test func environmentDirectoryAndArgumentsAreTheChildsOwn() throws {
            let request = SpawnRequest(
                ["/bin/sh", "-c", "echo \"$0|$1|$GREETING|$HOME|$(pwd)\"", "zero", "one"],
                environment: ["GREETING=hé llo"], directory: "/tmp")
            let (output, status) = try run(request)
            #expect(Spawning.Spawner.decode(status).exitCode == 0)
            // $0 is argv[1] of `sh -c`; HOME is unset: the environment is replaced, not merged.
            #expect(output == "zero|one|hé llo||/tmp\n")
        }

        @Test func aNewProcessGroupAndResetSignals() throws {
            // The parent blocks SIGTERM (as the server's threads do); the child must not inherit it.
            var term = sigset_t(), old = sigset_t()
            sigemptyset(&term)
            sigaddset(&term, SIGTERM)
            pthread_sigmask(SIG_BLOCK, &term, &old)
            defer { pthread_sigmask(SIG_SETMASK, &old, nil) }
            var request = SpawnRequest(["/bin/sh", "-c", "grep SigBlk /proc/self/status; echo $$ $(cut -d' ' -f5 /proc/self/stat)"])
            request.newProcessGroup = true
            let (output, _) = try run(request)
            let lines = output.split(separator: "\n")
            #expect(lines.first?.hasSuffix("0000000000000000") == true, "\(output)")
            // `cut` runs in the shell's group: field 5 of its stat is the group, the shell's pid.
            let ids = lines.last?.split(separator: " ") ?? []
            #expect(ids.count == 2 && ids[0] == ids[1], "pid and process group: \(output)")
        }

        @Test func onlyStandardDescriptorsReachTheChild() throws {
            // A descriptor without close-on-exec, as another thread's socket may be at any moment.
            let leaked = open("/dev/null", O_RDONLY)
            try #require(leaked >= 0)
            defer { close(leaked) }
            let (output, _) = try run(SpawnRequest(["/bin/sh", "-c", "ls /proc/self/fd"]))
            // 0, 1, 2 and the descriptor `ls` opens to read the directory; not `leaked`.
            let fds = Set(output.split(separator: "\n").compactMap { Int32($0) })
            #expect(!fds.contains(leaked) || leaked <= 3, "\(fds) includes \(leaked)")
            #expect(fds.isSubset(of: [0, 1, 2, 3]), "\(fds)")
        }

        @Test func filesAreTruncatedOrAppendedAndPathIsSearched() throws {
            let path = NSTemporaryDirectory() + "spawner-\(UInt32.random(in: 0...UInt32.max)).txt"
            defer { unlink(path) }
            for append in [false, true, true] {
                var request = SpawnRequest(["echo", "line"])
                request.searchPath = true
                request.stdout = .file(path, append: append)
                let child = try Spawning.Spawner.spawn(request)
                var status: Int32 = 0
                while waitpid(child.pid, &status, 0) < 0 && errno == EINTR {}
            }
            #expect(try String(contentsOfFile: path, encoding: .utf8) == "line\nline\nline\n")
        }

        @Test func aMissingExecutableIsAnErrorWithItsErrno() {
            #expect {
                try Spawning.Spawner.spawn(SpawnRequest(["/nonexistent/opqd-spawner-test"]))
            } throws: { error in
                guard case let .spawn(code)? = error as? SpawnError else { return false }
                return code == ENOENT
            }
            #expect {
                try Spawning.Spawner.spawn(SpawnRequest(["/bin/true"], directory: "/nonexistent-directory"))
            } throws: { error in
                guard case let .spawn(code)? = error as? SpawnError else { return false }
                return code == ENOENT
            }
        }
    }
}
