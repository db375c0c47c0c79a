--- :checkhealth diffusion_lsp: the server executable, Neovim's version and features, and
--- (when a client runs) whether the server loaded its model.

local M = {}

local health = vim.health

function M.check()
  local plugin = require('diffusion_lsp')
  local config = plugin.config or require('diffusion_lsp.config').resolve()

  health.start('diffusion-lsp: setup')
  if plugin.config then
    health.ok('setup() has been called')
  else
    health.warn("setup() has not been called", { "call require('diffusion_lsp').setup() in your config" })
  end

  health.start('diffusion-lsp: Neovim')
  local v = vim.version()
  local version = ('%d.%d.%d'):format(v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.10') == 0 then
    health.error('Neovim ' .. version .. ' is too old', { 'diffusion-lsp needs Neovim 0.10 or newer' })
  else
    health.ok('Neovim ' .. version)
  end
  if plugin.has_inline_completion() then
    local mode = config.inline and 'ghost text' or 'the completion menu (inline = false)'
    health.ok('vim.lsp.inline_completion is available; fills are shown as ' .. mode)
  else
    health.warn('vim.lsp.inline_completion is not available (Neovim 0.12+)', {
      'fills are offered as the first item of the completion menu instead',
    })
  end

  health.start('diffusion-lsp: server')
  local exe = config.cmd[1]
  if vim.fn.executable(exe) == 1 then
    health.ok(('server executable found: %s'):format(vim.fn.exepath(exe)))
  else
    health.error(('server executable not found: %s'):format(exe), {
      "pip install diffusion-lsp (it provides the 'diffusion-lsp' command)",
      "or set cmd = { '/path/to/python', '-m', 'lsp_server' } in setup()",
    })
  end
  local clients = vim.lsp.get_clients({ name = plugin.NAME })
  if #clients == 0 then
    health.info('no diffusion-lsp client running (open a file of a configured filetype)')
    return
  end
  for _, client in ipairs(clients) do
    local params = { command = 'diffusion.stats', arguments = {} }
    local ok, answer
    if vim.fn.has('nvim-0.11') == 1 then
      ok, answer = pcall(client.request_sync, client, 'workspace/executeCommand', params, 5000)
    else
      ok, answer = pcall(client.request_sync, 'workspace/executeCommand', params, 5000)
    end
    local stats = ok and answer and answer.result or nil
    if type(stats) ~= 'table' then
      health.warn(('client %d: the server did not answer diffusion.stats'):format(client.id))
    elseif stats.model_loaded then
      health.ok(('client %d: model loaded'):format(client.id))
    elseif stats.load_error and stats.load_error ~= vim.NIL then
      health.error(('client %d: %s'):format(client.id, stats.load_error))
    else
      health.info(('client %d: the model is still loading'):format(client.id))
    end
  end
end

return M
