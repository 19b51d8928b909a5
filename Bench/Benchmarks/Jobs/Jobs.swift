// Spindle's jobs beside Foundation's operations (OperationQueue,
// BlockOperation), in the same run.
//
// Every group builds its jobs, adds them and waits for the queue inside the
// measured iteration, so one operation is one job's whole life: made,
// queued, started on a worker, finished, its dependents released. Work in
// each job is empty: what is measured is the machinery. One thread (the
// benchmark's) waits for the workers, so CPU time per job is reported
// beside the wall clock.
//
// Shapes:
// - independent: 10^5 closure jobs on a queue of width 2, then wait;
// - chain: 1,000 jobs each depending on the one before (one at a time);
// - binary tree: 10^4 jobs, each depending on its parent (Taskflow's
//   "binary tree" benchmark shape: fan-out);
// - wavefront: a 100 × 100 grid, each job depending on its left and upper
//   neighbours (Taskflow's "wavefront").
// The graph groups use each queue's default width (Spindle: the pool's
// width; Foundation: its own choice).

import Benchmark
import BenchSupport
import Foundation
import Spindle

// MARK: - Graph shapes

/// The dependencies of job `i` of a shape, as indices of earlier jobs.
enum Shape {
    case chain(Int)
    case binaryTree(Int)
    case wavefront(side: Int)

    var count: Int {
        switch self {
        case .chain(let n), .binaryTree(let n): n
        case .wavefront(let side): side * side
        }
    }

    func dependencies(of i: Int) -> [Int] {
        switch self {
        case .chain:
            return i == 0 ? [] : [i - 1]
        case .binaryTree:
            return i == 0 ? [] : [(i - 1) / 2]
        case .wavefront(let side):
            let (row, column) = (i / side, i % side)
            var deps: [Int] = []
            if row > 0 { deps.append(i - side) }
            if column > 0 { deps.append(i - 1) }
            return deps
        }
    }
}

func spindleGraph(_ shape: Shape) -> (Benchmark) -> Void {
    let queue = JobQueue(name: "bench.graph")
    let edges = (0..<shape.count).map(shape.dependencies(of:))
    return selfTimed(shape.count) {
        var jobs: [Job] = []
        jobs.reserveCapacity(edges.count)
        for deps in edges {
            let job = ClosureJob {}
            for d in deps { job.addDependency(jobs[d]) }
            jobs.append(job)
        }
        queue.add(jobs)
        queue.waitUntilAllJobsAreFinished()
    }
}

func foundationGraph(_ shape: Shape) -> (Benchmark) -> Void {
    let queue = OperationQueue()
    let edges = (0..<shape.count).map(shape.dependencies(of:))
    return selfTimed(shape.count) {
        var operations: [Operation] = []
        operations.reserveCapacity(edges.count)
        for deps in edges {
            let operation = BlockOperation {}
            for d in deps { operation.addDependency(operations[d]) }
            operations.append(operation)
        }
        queue.addOperations(operations, waitUntilFinished: false)
        queue.waitUntilAllOperationsAreFinished()
    }
}

// MARK: - Timing

/// `run` as one measured iteration of `operations` jobs that times itself:
/// it records its own time per job (`timePerOperation`), then restarts the
/// harness's window so that the harness times only the call's tail.
/// OperationQueue needs more than two seconds for a 10^4-job graph, and
/// package-benchmark drops the throughput of an iteration that long (it
/// rounds iterations per second to an integer), and with it the row from
/// the JMH export that BenchReport reads.
func selfTimed(_ operations: Int, _ run: @escaping () -> Void) -> (Benchmark) -> Void {
    { benchmark in
        let clock = ContinuousClock()
        let begin = clock.now
        run()
        benchmark.recordTimePerOperation(elapsed: clock.now - begin, operations: operations)
        benchmark.startMeasurement()
    }
}

// MARK: - Registration

let benchmarks: @Sendable () -> Void = {
    // One iteration is a whole batch or graph: `operations` jobs, timed by
    // the iteration itself (`selfTimed`), CPU time per job beside it.
    func settings(_ operations: Int) -> RunSettings {
        RunSettings(
            scalingFactor: .one, maxDuration: .seconds(2), maxIterations: 50, warmupIterations: 2,
            reportedMetrics: [.timePerOperation, .cpuPerOperation], operationsPerIteration: operations)
    }

    do {
        let count = 100_000
        let jobs = JobQueue(name: "bench.independent")
        jobs.maxConcurrentJobCount = 2
        let operations = OperationQueue()
        operations.maxConcurrentOperationCount = 2
        sideBySide(
            group: "job.independent 100000 closures width 2",
            settings: settings(count),
            spindle: selfTimed(count) {
                for _ in 0..<count { jobs.add(ClosureJob {}) }
                jobs.waitUntilAllJobsAreFinished()
            },
            peers: [
                .reference("OperationQueue", body: selfTimed(count) {
                    for _ in 0..<count { operations.addOperation(BlockOperation {}) }
                    operations.waitUntilAllOperationsAreFinished()
                }),
            ]
        )
    }

    for (group, shape) in [
        ("job.chain 1000 links", Shape.chain(1_000)),
        ("job.binarytree 10000 jobs", Shape.binaryTree(10_000)),
        ("job.wavefront 100x100 jobs", Shape.wavefront(side: 100)),
    ] {
        sideBySide(
            group: group,
            settings: settings(shape.count),
            spindle: spindleGraph(shape),
            peers: [.reference("OperationQueue", body: foundationGraph(shape))]
        )
    }
}
