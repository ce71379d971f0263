-- wrk script: POST JSON bodies read from a file (one body per line), cycling through them in
-- order, so that consecutive requests differ. The requests are formatted once, in init().
--   taskset -c 1 wrk -t1 -c64 -d10s -s benches/load/post.lua URL -- BODIES.jsonl
-- Each wrk thread has its own Lua state (and cycle); the bench uses one thread (-t1).

local requests = {}
local n = 0
local i = 0

function init(args)
  local path = args[1]
  if path == nil then
    error("usage: wrk ... -s post.lua URL -- BODIES.jsonl")
  end
  local headers = { ["Content-Type"] = "application/json" }
  for line in io.lines(path) do
    if #line > 0 then
      n = n + 1
      requests[n] = wrk.format("POST", nil, headers, line)
    end
  end
  if n == 0 then
    error("no request bodies in " .. path)
  end
end

function request()
  i = i % n + 1
  return requests[i]
end
