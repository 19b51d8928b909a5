/// The dependency edges of every job, guarded by one lock, so that the cycle
/// check of `Job.addDependency(_:)` sees a graph nobody changes under it
/// (two threads adding `a -> b` and `b -> a` at once cannot both pass).
/// Finishing jobs never take it: they release their dependents through each
/// job's own lock.
enum JobGraph {
    /// Guards `Job.dependencyList` and `Job.dependentEdges`. Taken before any
    /// job's lock, never while one is held.
    static let lock = GuardLock()

    /// The dependency path from `start` to `target` (`start`, …, `target`),
    /// following only jobs that have not finished (a finished job holds
    /// nobody back, so a loop through it can never keep a job from running),
    /// or nil. Under `lock`. Depth-first, each job visited
    /// once.
    static func path(from start: Job, to target: Job) -> [Job]? {
        if start.isFinished { return nil }
        var parent: [ObjectIdentifier: Job] = [ObjectIdentifier(start): start]
        var stack: [Job] = [start]
        while let job = stack.popLast() {
            if job === target {
                var path: [Job] = [job]
                var node = job
                while node !== start {
                    node = parent[ObjectIdentifier(node)]!
                    path.append(node)
                }
                return path.reversed()
            }
            for next in job.dependencyList where !next.isFinished {
                let key = ObjectIdentifier(next)
                if parent[key] == nil {
                    parent[key] = job
                    stack.append(next)
                }
            }
        }
        return nil
    }
}
