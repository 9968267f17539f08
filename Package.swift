// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "opqd",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "opqd", targets: ["opqd"]),
        .executable(name: "opqd-bench", targets: ["opqd-bench"]),
        .library(name: "QueueEngine", targets: ["QueueEngine"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
    ],
    targets: [
        // libmicrohttpd itself (apt: libmicrohttpd-dev) plus a fixed-arity shim for its variadic calls.
        .systemLibrary(
            name: "CMicroHTTPD",
            pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"])]
        ),
        // Small HTTP server on libmicrohttpd. Only Bridge/ touches MHD_*.
        .target(name: "MicroHTTP", dependencies: ["CMicroHTTPD"]),
        // Pure Swift engine: no HTTP, no C.
        // Release builds drop the runtime exclusivity checks here: the engine mutates its
        // records only under its one lock, and the checks cost ~15% of the flat benchmark.
        .target(name: "QueueEngine", swiftSettings: [.unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))]),
        // SQLite itself (apt: libsqlite3-dev); used only by QueueStore.
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        // Durable store behind the engine's OperationStore protocol.
        .target(name: "QueueStore", dependencies: ["QueueEngine", "CSQLite"]),
        // What operations do.
        .target(name: "QueueKinds", dependencies: ["QueueEngine"]),
        // Routes, DTOs, error mapping.
        .target(
            name: "QueueAPI",
            dependencies: [
                "QueueEngine", "QueueKinds", "QueueStore", "MicroHTTP",
                .product(name: "Logging", package: "swift-log"),
            ],
            resources: []
        ),
        .executableTarget(
            name: "opqd",
            dependencies: ["QueueAPI", .product(name: "Logging", package: "swift-log")]
        ),
        .executableTarget(
            name: "opqd-bench",
            dependencies: ["QueueEngine", "QueueKinds", "QueueAPI"]
        ),
        .target(name: "QueueTesting", dependencies: ["QueueAPI", "MicroHTTP"]),
        .testTarget(name: "QueueEngineTests", dependencies: ["QueueEngine"]),
        .testTarget(name: "QueueKindsTests", dependencies: ["QueueKinds", "QueueEngine"]),
        .testTarget(name: "QueueStoreTests", dependencies: ["QueueStore", "QueueEngine"]),
        .testTarget(name: "MicroHTTPTests", dependencies: ["MicroHTTP"]),
        .testTarget(name: "APITests", dependencies: ["QueueAPI", "QueueTesting", "QueueEngine"]),
    ]
)
