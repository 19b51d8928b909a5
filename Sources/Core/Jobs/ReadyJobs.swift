/// A `JobQueue`'s jobs that became ready and have not been handed to a
/// worker: one first-in-first-out lane per queue priority, taken highest
/// lane first. Not synchronized: the queue's lock guards it.
///
/// A job may sit here more than once, or no longer be ready (a dependency
/// added after it was listed); `popStartable` skips such entries, and the
/// job's own claim (`Job.run(byQueue:)`) is the final word.
struct ReadyJobs {
    private var lanes: [[Job]] = Array(repeating: [], count: 5)
    private var heads: [Int] = Array(repeating: 0, count: 5)
    /// Entries listed and not taken (stale ones included).
    private(set) var count = 0

    mutating func append(_ job: Job) {
        lanes[job.frozenQueueLane].append(job)
        count += 1
    }

    /// The first startable job of the highest non-empty lane, or nil.
    mutating func popStartable() -> Job? {
        guard count > 0 else { return nil }
        var lane = 4
        while lane >= 0 {
            while heads[lane] < lanes[lane].count {
                let job = lanes[lane][heads[lane]]
                heads[lane] += 1
                count -= 1
                if heads[lane] == lanes[lane].count {
                    lanes[lane].removeAll(keepingCapacity: true)
                    heads[lane] = 0
                } else if heads[lane] >= 1024 && heads[lane] * 2 >= lanes[lane].count {
                    // Drop the taken prefix once it is most of the array.
                    lanes[lane].removeFirst(heads[lane])
                    heads[lane] = 0
                }
                if job.isStartableHint { return job }
            }
            lane -= 1
        }
        return nil
    }
}
