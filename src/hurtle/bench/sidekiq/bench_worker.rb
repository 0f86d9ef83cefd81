# The Sidekiq side of `hurtle bench tasks`: an `Add` job and the same probe as
# hurtle.bench.harness.probe.
#
# Loaded by the worker (`sidekiq -r bench_worker.rb`) and by bench_publish.rb. Redis comes from
# HURTLE_BENCH_REDIS_URL. Each finished job adds one to a counter and keeps the CLOCK_MONOTONIC
# time of the first and last; a thread writes them to $HURTLE_BENCH_PROBE_DIR/<pid>.json every
# 50 ms and at exit. No Redis round trip is added per job.
require "json"
require "sidekiq"

redis = { url: ENV.fetch("HURTLE_BENCH_REDIS_URL") }
Sidekiq.configure_server { |config| config.redis = redis }
Sidekiq.configure_client { |config| config.redis = redis }
Sidekiq.logger.level = Logger::WARN

module BenchProbe
  @lock = Mutex.new
  @count = 0
  @first = 0.0
  @last = 0.0

  def self.hit
    now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    @lock.synchronize do
      if @count.zero?
        @first = now
        start_reporter
      end
      @count += 1
      @last = now
    end
  end

  def self.write(path)
    tmp = "#{path}.tmp"
    File.write(tmp, JSON.generate(count: @count, first: @first, last: @last, pid: Process.pid))
    File.rename(tmp, path)
  end

  def self.start_reporter
    dir = ENV["HURTLE_BENCH_PROBE_DIR"]
    return if dir.nil? || dir.empty?

    path = File.join(dir, "#{Process.pid}.json")
    at_exit { write(path) }
    Thread.new do
      written = -1
      loop do
        if @count != written
          written = @count
          write(path)
        end
        sleep 0.05
      end
    end
  end
end

class Add
  include Sidekiq::Worker

  def perform(x, y)
    BenchProbe.hit
    x + y
  end
end
