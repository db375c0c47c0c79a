-- Helpers for the e2e scenarios: each scenario runs in a coroutine that yields to
-- Neovim's main loop while it waits, so typed keys, timers and LSP messages are handled
-- exactly as when a person uses the editor.

local H = {}
H.__index = H

local uv = vim.uv or vim.loop

function H.new(spec, result)
  return setmetatable({ spec = spec, result = result, timeout = spec.timeout_ms or 30000, started = uv.now() }, H)
end

--- Resume the scenario from the main loop.
function H:_resume(...)
  local ok, err = coroutine.resume(self.co, ...)
  if not ok then
    self.result.error = tostring(err) .. '\n' .. debug.traceback(self.co)
    self.done(1)
  end
end

--- Run `scenario(h)` in a coroutine; `done(code)` ends Neovim.
function H:run(scenario, done)
  self.done = done
  self.co = coroutine.create(function()
    scenario(self)
    done(0)
  end)
  vim.schedule(function()
    self:_resume()
  end)
end

--- Wait (letting the main loop run) until `cond()` returns a truthy value; return it.
--- Fails the scenario with `what` when it does not come within the timeout.
function H:wait(cond, what, timeout)
  self:log('waiting for ' .. what)
  local deadline = uv.now() + (timeout or self.timeout)
  local timer = assert(uv.new_timer())
  timer:start(
    0,
    20,
    vim.schedule_wrap(function()
      if timer:is_closing() then
        return
      end
      local ok, value = pcall(cond)
      if (ok and value) or uv.now() > deadline then
        timer:stop()
        timer:close()
        self:_resume(ok and value or nil)
      end
    end)
  )
  local value = coroutine.yield()
  if not value then
    error('timed out waiting for ' .. what, 2)
  end
  return value
end

--- Let the main loop run for `ms` milliseconds.
function H:sleep(ms)
  local timer = assert(uv.new_timer())
  timer:start(ms, 0, vim.schedule_wrap(function()
    timer:close()
    self:_resume()
  end))
  coroutine.yield()
end

--- Type keys as a user would (mappings apply), then let Neovim handle them.
function H:feed(keys)
  vim.api.nvim_feedkeys(vim.keycode(keys), 'm', false)
  self:wait(function()
    return vim.fn.getchar(1) == 0 -- typeahead consumed
  end, 'the keys ' .. keys .. ' to be handled')
end

function H:log(msg)
  table.insert(self.result.log, msg)
  io.stderr:write(('[%d ms] %s\n'):format(uv.now() - self.started, msg))
end

--- The diffusion-lsp client, once it has initialized and loaded its model.
function H:client(bufnr)
  local client = self:wait(function()
    local c = vim.lsp.get_clients({ bufnr = bufnr or 0, name = 'diffusion_lsp' })[1]
    return c and c.initialized and c
  end, 'the diffusion-lsp client to start')
  self:wait(function()
    local answer = client:request_sync('workspace/executeCommand', { command = 'diffusion.stats' }, 5000)
    return answer and answer.result and answer.result.model_loaded
  end, 'the model to load')
  return client
end

function H:lines(bufnr)
  return vim.api.nvim_buf_get_lines(bufnr or 0, 0, -1, false)
end

function H:text(bufnr)
  return table.concat(self:lines(bufnr), '\n') .. '\n'
end

return H
