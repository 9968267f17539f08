import CFuzzDriver
import Foundation

/// The entry point of a fuzz target that reaches libFuzzer through ``CFuzzDriver``: built with
/// `-sanitize=fuzzer` it hands the command line to libFuzzer's driver; built normally it
/// replays the files and directories it is given (or `defaultCorpus`) through `one`.
public enum FuzzMain {
    public static func run(_ name: String, defaultCorpus: String, callback: CFuzzDriver_Callback, one: ([UInt8]) -> Void) -> Never {
        var argc = CommandLine.argc
        var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
        let code = CFuzzDriver_run(&argc, &argv, callback)
        if code >= 0 { exit(code) }
        let paths = Array(CommandLine.arguments.dropFirst())
        exit(replay(name, paths.isEmpty ? [defaultCorpus] : paths, one))
    }

    /// Runs every file under `paths` through `one`; 1 when a path does not exist.
    public static func replay(_ name: String, _ paths: [String], _ one: ([UInt8]) -> Void) -> Int32 {
        var files: [String] = []
        for path in paths {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
                print("\(name): no such file \(path)")
                return 1
            }
            if isDirectory.boolValue {
                let names = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
                files += names.sorted().map { "\(path)/\($0)" }
            } else {
                files.append(path)
            }
        }
        for file in files {
            guard let data = FileManager.default.contents(atPath: file) else { continue }
            one(Array(data))
        }
        print("\(name): replayed \(files.count) inputs without a finding")
        return 0
    }
}
