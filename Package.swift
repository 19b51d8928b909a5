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
        // A deliberate data race: scripts/test fails unless ThreadSanitizer reports it.
        .executableTarget(
            name: "TSanCanary",
            dependencies: [],
            path: "Tests/TSanCanary"
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
