# Publishes COUNT `Add.perform_async(5, 6)` jobs, the way the Sidekiq docs show, and times it.
#
#   ruby bench_publish.rb COUNT
#
# Writes {"count", "seconds"} to $HURTLE_BENCH_RESULT_FILE and progress to
# $HURTLE_BENCH_PROGRESS_FILE, like hurtle.bench.harness.publish.
require_relative "bench_worker"

count = Integer(ARGV.fetch(0))
progress_file = ENV["HURTLE_BENCH_PROGRESS_FILE"]
last_progress = 0.0
clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }

started = clock.call
1.upto(count) do |i|
  Add.perform_async(5, 6)
  next unless (i % 1000).zero? && progress_file

  now = clock.call
  if now - last_progress >= 0.1
    File.write(progress_file, i.to_s)
    last_progress = now
  end
end
seconds = clock.call - started
File.write(progress_file, count.to_s) if progress_file
result = JSON.generate(count: count, seconds: seconds)
if (out = ENV["HURTLE_BENCH_RESULT_FILE"])
  File.write(out, result)
else
  puts result
end
