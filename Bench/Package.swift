// swift-tools-version: 6.1
// Spindle's benchmarks, a package of their own so that users of the library
// never build a benchmark dependency. `scripts/bench` (in the repository root)
// builds and runs it; see the comment in Sources/BenchSupport/SideBySide.swift
// for how benchmarks are named and how a new benchmark target is added.
import Foundation
import PackageDescription

let package = Package(
    name: "SpindleBench",
    dependencies: [
        // The library under measurement, by path: the repository root.
        .package(name: "Spindle", path: ".."),
        // The harness. "MallocInterposer" is named so that the default traits
        // (which would also need ordo-one/swift-runtime-interposer on Swift 6.3)
        // are not taken; malloc metrics still work through the interposer.
        .package(
            url: "https://github.com/ordo-one/package-benchmark",
            from: "1.38.1",
            traits: ["MallocInterposer"]
        ),
        // Peers: NIOLock, measured beside Spindle's locks; NIOPosix's event
        // loop as an actor's executor, beside Spindle's (Concurrency only).
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
    ],
    targets: [
        // Shared helpers: side-by-side registration and stable, padded memory.
        .target(
            name: "BenchSupport",
            dependencies: [
                .product(name: "Benchmark", package: "package-benchmark"),
            ]
        ),
        // Turns package-benchmark's JMH export into the side-by-side table.
        // Foundation only, so it builds and runs without the harness.
        .executableTarget(name: "BenchReport"),
        // Thread creation latency (median and p99 from timestamps taken in
        // the entry routine) and the memory a parked thread costs, printed.
        // Spindle beside pthread and Foundation; no harness.
        .executableTarget(
            name: "ThreadCosts",
            dependencies: [.product(name: "Spindle", package: "Spindle")]
        ),
    ],
    swiftLanguageModes: [.v6]
)

// Benchmark targets: one per folder Benchmarks/<Name>/, as the
// BenchmarkPlugin requires, named <Name>Benchmarks (a bare "Atomics" would
// clash with swift-atomics' module, which package-benchmark depends on).
// Listed by name rather than discovered: SwiftPM caches an evaluated manifest
// by its text, so a manifest that lists the directory would not notice a new
// folder. Adding a benchmark target is adding its folder and its name here.
// Each one can use Spindle, BenchSupport, package-benchmark and the peers above.
let benchmarkFolders = [
    "Atomics", "Concurrency", "Conditions", "EventSources", "Jobs", "LockOrder", "Locks", "Ports", "Queues", "RunLoop",
    "Threads",
]

// Peers that only some targets measure against, by folder.
let extraPeers: [String: [Target.Dependency]] = [
    "Concurrency": [
        .product(name: "NIOCore", package: "swift-nio"),
        .product(name: "NIOPosix", package: "swift-nio"),
    ],
]

for name in benchmarkFolders {
    package.targets.append(
        .executableTarget(
            name: "\(name)Benchmarks",
            dependencies: [
                "BenchSupport",
                .product(name: "Benchmark", package: "package-benchmark"),
                .product(name: "Spindle", package: "Spindle"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ] + extraPeers[name, default: []],
            path: "Benchmarks/\(name)",
            plugins: [
                .plugin(name: "BenchmarkPlugin", package: "package-benchmark"),
            ]
        )
    )
}
