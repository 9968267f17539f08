import Spawning

#if canImport(Glibc)
import Glibc
#endif

// MARK: - posix_spawn

/// The child as the `Spawning` module starts it: a process group of its own, stdin /dev/null,
/// stdout and stderr on close-on-exec pipes, every other descriptor closed, signals reset.
enum Spawn {
    enum Outcome {
        case success(pid: pid_t, out: Int32, err: Int32)
        case failure(String)
    }

    static func run(_ spec: CommandSpec) -> Outcome {
        var request = SpawnRequest(spec.argv, environment: spec.environment, directory: spec.cwd)
        request.newProcessGroup = true
        request.stdout = .pipe
        request.stderr = .pipe
        do throws(SpawnError) {
            let child = try Spawner.spawn(request)
            guard let out = child.stdout, let err = child.stderr else { return .failure("no pipes for the child's output") }
            return .success(pid: child.pid, out: out, err: err)
        } catch let .spawn(rc) {
            let place = spec.cwd.map { " in \($0)" } ?? ""
            return .failure("cannot run \(spec.argv[0])\(place): \(String(cString: strerror(rc)))")
        } catch {
            return .failure(error.description)
        }
    }
}
