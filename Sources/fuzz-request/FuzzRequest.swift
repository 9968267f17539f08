import Glibc

/// libFuzzer's entry: one input through opqd's request path (see `Harness`).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRequestTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data else { return 0 }
    Harness.shared.run(UnsafeBufferPointer(start: data, count: size))
    return 0
}

#if FUZZING
/// libFuzzer's driver (LLVM >= 11). SwiftPM links an executable with `main` aliased to this
/// module's own entry point, so libFuzzer's `main` is never pulled from its archive: this
/// `@main` hands the command line to libFuzzer instead.
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt
#endif

@main
enum FuzzRequestMain {
    static func main() {
        _ = Harness.shared  // builds the applications (and the network namespace) before input 1
        #if FUZZING
        var argc = CommandLine.argc
        var argv = CommandLine.unsafeArgv
        exit(LLVMFuzzerRunDriver(&argc, &argv, fuzzRequestTestOneInput))
        #else
        replay(Array(CommandLine.arguments.dropFirst()))
        #endif
    }

    /// Without libFuzzer: runs every file named (directories: every file in them, sorted) through
    /// the same function, in order, with state carried over as when fuzzing. Exits 0 when none crashed.
    static func replay(_ paths: [String]) {
        if paths.isEmpty || paths.contains("-help") || paths.contains("--help") {
            print("usage: fuzz-request FILE|DIR ...   (replay; build with -sanitize=fuzzer -DFUZZING to fuzz)")
            exit(paths.isEmpty ? 2 : 0)
        }
        var count = 0
        for path in paths {
            for file in files(path) {
                guard let bytes = read(file) else {
                    printError("fuzz-request: cannot read \(file)")
                    exit(1)
                }
                bytes.withUnsafeBufferPointer { Harness.shared.run($0) }
                count += 1
            }
        }
        print("fuzz-request: replayed \(count) input(s)")
    }

    static func files(_ path: String) -> [String] {
        guard let dir = opendir(path) else { return [path] }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name.hasPrefix(".") { continue }
            names.append(name)
        }
        return names.sorted().map { path + "/" + $0 }
    }

    static func read(_ path: String) -> [UInt8]? {
        guard let f = fopen(path, "rb") else { return nil }
        defer { fclose(f) }
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&buffer, 1, buffer.count, f)
            if n > 0 { out.append(contentsOf: buffer[0..<n]) }
            if n < buffer.count { break }
        }
        return out
    }
}
