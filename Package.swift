// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "Spindle",
    products: [
        .library(name: "Spindle", targets: ["Spindle"]),
    ],
    targets: [
        // System libraries, found through pkg-config; SwiftPM names the apt
        // package when one is missing (scripts/setup installs both).
        .systemLibrary(
            name: "CLibURing",
            path: "Sources/CLibURing",
            pkgConfig: "liburing",
            providers: [.apt(["liburing-dev"])]
        ),
        .systemLibrary(
            name: "CLibNUMA",
            path: "Sources/CLibNUMA",
            pkgConfig: "numa",
            providers: [.apt(["libnuma-dev"])]
        ),
        // The only code that talks to the kernel directly.
        .target(
            name: "CShims",
            dependencies: ["CLibURing", "CLibNUMA"],
            path: "Sources/CShims"
        ),
        .target(
            name: "Spindle",
            dependencies: ["CShims"],
            path: "Sources/Core"
        ),
        .target(
            name: "TestSupport",
            dependencies: ["Spindle"],
            path: "Tests/TestSupport"
        ),
        .testTarget(
            name: "SpindleTests",
            dependencies: ["Spindle", "CShims", "TestSupport"],
            path: "Tests/SpindleTests"
        ),
        // Randomized multi-thread stress; scripts/test runs it under ThreadSanitizer.
        .testTarget(
            name: "StressTests",
            dependencies: ["Spindle", "TestSupport"],
            path: "Tests/StressTests"
        ),
        // Planted bugs run with and without schedule perturbation; measures,
        // asserts nothing, and is not part of the test run.
        .executableTarget(
            name: "PerturbationHarness",
            dependencies: ["Spindle", "TestSupport"],
            path: "Tests/PerturbationHarness"
        ),
        // A deliberate data race: scripts/test fails unless ThreadSanitizer reports it.
        .executableTarget(
            name: "TSanCanary",
            dependencies: [],
            path: "Tests/TSanCanary"
        ),
        // Misuse only a program's main thread can commit, run by the unit
        // tests as a child process (WorkQueueMisuseTests).
        .executableTarget(
            name: "MisuseProbe",
            dependencies: ["Spindle"],
            path: "Tests/MisuseProbe"
        ),
        // Races inside Spindle critical sections: scripts/test fails unless
        // ThreadSanitizer's reports name the Spindle lock held (the mutex
        // annotations of cshims_tsan.h).
        .executableTarget(
            name: "TSanLockCanary",
            dependencies: ["Spindle"],
            path: "Tests/TSanLockCanary"
        ),
    ],
    swiftLanguageModes: [.v6]
)
