-- The e2e tests' Neovim config: load the plugin from editors/nvim as a user's config
-- would, then run one scenario (scenarios.lua) once Neovim has started, write what it
-- saw as JSON and quit: exit code 0 when the scenario ran to its end, 1 when it failed,
-- 2 when it hung past the deadline.
--
-- Input: $DIFFUSION_E2E, a JSON object: plugin (editors/nvim), scenarios (this folder),
-- name (the scenario), file (the fixture copy to edit), result (JSON output path),
-- setup (the options for setup()), timeout_ms (per wait), deadline_ms (whole run).

local uv = vim.uv or vim.loop
local result = { log = {} }
local spec = {}

local function finish(code)
  local f = io.open(spec.result or 'e2e-result.json', 'w')
  if f then
    f:write(vim.json.encode(result))
    f:close()
  end
  vim.cmd(code == 0 and 'qall!' or ('cquit! ' .. code))
end

local function main()
  spec = vim.json.decode((assert(vim.env.DIFFUSION_E2E, '$DIFFUSION_E2E is not set')))
  package.path = spec.scenarios .. '/?.lua;' .. package.path
  vim.opt.runtimepath:prepend(spec.plugin)
  vim.opt.swapfile = false
  vim.cmd('filetype plugin indent on')

  require('diffusion_lsp').setup(spec.setup)

  local h = require('harness').new(spec, result)
  local scenario = assert(dofile(spec.scenarios .. '/scenarios.lua')[spec.name], 'no scenario ' .. spec.name)
  vim.api.nvim_create_autocmd('VimEnter', {
    once = true,
    callback = function()
      h:run(scenario, finish)
    end,
  })

  -- a backstop: a scenario that hangs still reports where it was
  local watchdog = assert(uv.new_timer())
  watchdog:start(
    spec.deadline_ms or 120000,
    0,
    vim.schedule_wrap(function()
      result.error = 'the scenario did not finish in time; last step: ' .. tostring(result.log[#result.log])
      finish(2)
    end)
  )
end

local ok, err = xpcall(main, debug.traceback)
if not ok then
  result.error = 'the test config failed: ' .. tostring(err)
  finish(1)
end
