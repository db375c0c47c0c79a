--- diffusion-lsp for Neovim: starts the diffusion-lsp language server for the configured
--- filetypes, shows its fills as ghost text (vim.lsp.inline_completion, Neovim 0.12+) or
--- in the completion menu (older versions, or `inline = false`), renders drafts as the
--- fill forms. The user commands for the server's rewrites (plugin/diffusion_lsp.lua,
--- defined at load):
---
---   :DiffusionFillHoles     fill every hole in the buffer
---   :DiffusionFillHole      fill the hole at the cursor
---   :[range]DiffusionRegenerate  regenerate the selection (or the range's lines)
---   :[range]DiffusionRefine      refine the selection: the few fixes it needs
---   :DiffusionNextEdit[!]   suggest the next edit at the cursor (again, or !, to apply it)
---
--- Usage: `require('diffusion_lsp').setup({ settings = { maxSteps = 8 } })`.

local M = {}

local api = vim.api
local actions = require('diffusion_lsp.actions')
local drafts = require('diffusion_lsp.drafts')
local util = require('diffusion_lsp.util')

M.NAME = actions.NAME

--- The resolved options of the last setup() call.
---@type diffusion_lsp.Config?
M.config = nil

--- Whether this Neovim shows LSP inline completions (0.12+).
---@return boolean
function M.has_inline_completion()
  return vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.enable ~= nil
end

---@return boolean
local function use_inline()
  return M.config ~= nil and M.config.inline and M.has_inline_completion()
end

--- Ask for a suggestion at the cursor now (all candidates, like the user asking), rather
--- than after the automatic debounce. Neovim's public inline completion API sends only
--- its own automatic requests, so the server is told first (diffusion.suggestNow: the
--- next request counts as asked for), then a cursor event makes Neovim send it.
---@param bufnr? integer
function M.trigger(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  if use_inline() then
    actions.tell(bufnr, 'diffusion.suggestNow', function()
      if api.nvim_buf_is_valid(bufnr) then
        api.nvim_exec_autocmds('CursorMovedI', { buffer = bufnr, modeline = false })
      end
    end)
  elseif vim.lsp.completion and vim.lsp.completion.get then
    vim.lsp.completion.get()
  else
    api.nvim_feedkeys(vim.keycode('<C-x><C-o>'), 'n', false)
  end
end

--- Accept the shown suggestion. Returns false when none is shown.
---@return boolean
function M.accept()
  return use_inline() and vim.lsp.inline_completion.get() or false
end

--- Accept the next word (`unit` 'word') or line ('line') of the shown suggestion, as
--- VS Code accepts them (util.next_piece); the rest comes back at once as the next
--- suggestion (the server types through what it showed). Returns false when none is shown.
---@param unit 'word'|'line'
---@return boolean
function M.accept_part(unit)
  if not use_inline() then
    return false
  end
  return vim.lsp.inline_completion.get({
    on_accept = function(item)
      local text = item.insert_text
      if type(text) ~= 'string' then
        return -- a snippet is accepted whole or not at all
      end
      local bufnr = api.nvim_get_current_buf()
      local row, col = unpack(api.nvim_win_get_cursor(0))
      local typed = ''
      if item.range then -- the suggestion replaces its range: the part before the cursor is typed
        local s = item.range.start
        typed = table.concat(api.nvim_buf_get_text(bufnr, s.row, s.col, row - 1, col, {}), '\n')
      end
      if text:sub(1, #typed) ~= typed then
        return
      end
      local lines = vim.split(util.next_piece(text:sub(#typed + 1), unit), '\n', { plain = true })
      api.nvim_buf_set_text(bufnr, row - 1, col, row - 1, col, lines)
      api.nvim_win_set_cursor(0, { row + #lines - 1, (#lines == 1 and col or 0) + #lines[#lines] })
    end,
  })
end

--- Show the next (count > 0) or previous candidate.
---@param count integer
function M.cycle(count)
  if use_inline() then
    vim.lsp.inline_completion.select({ count = count })
  end
end

--- Hide the suggestion until the next keystroke: the server stops its fill and forgets
--- it (diffusion.dismiss), and Neovim's inline completion is switched off and on again
--- for the buffer, which clears what it shows.
---@param bufnr? integer
function M.dismiss(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  if use_inline() then
    actions.tell(bufnr, 'diffusion.dismiss')
    vim.lsp.inline_completion.enable(false, { bufnr = bufnr })
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
  end
  drafts.clear(bufnr)
end

--- Insert-mode keys, buffer-local.
---@param bufnr integer
local function map_keys(bufnr)
  local keys = assert(M.config).keys
  local function map(lhs, rhs, desc, opts)
    if lhs then
      vim.keymap.set('i', lhs, rhs, vim.tbl_extend('force', { buffer = bufnr, desc = desc }, opts or {}))
    end
  end
  map(keys.accept, function()
    if not M.accept() then
      return keys.accept -- nothing shown: the key does what it always does
    end
  end, 'diffusion-lsp: accept the suggestion', { expr = true, replace_keycodes = true })
  for _, unit in ipairs({ 'word', 'line' }) do
    local lhs = keys['accept_' .. unit]
    map(lhs, function()
      if not M.accept_part(unit) then
        return lhs -- nothing shown: the key does what it always does
      end
    end, 'diffusion-lsp: accept the next ' .. unit .. ' of the suggestion', { expr = true, replace_keycodes = true })
  end
  map(keys.next, function()
    M.cycle(1)
  end, 'diffusion-lsp: next candidate')
  map(keys.prev, function()
    M.cycle(-1)
  end, 'diffusion-lsp: previous candidate')
  map(keys.trigger, function()
    M.trigger(bufnr)
  end, 'diffusion-lsp: suggest now')
  map(keys.dismiss, function()
    M.dismiss(bufnr)
  end, 'diffusion-lsp: hide the suggestion')
end

--- What a client needs once it attached to a buffer.
---@param args { buf: integer, data: { client_id: integer } }
local function on_attach(args)
  local client = vim.lsp.get_client_by_id(args.data.client_id)
  if not client or client.name ~= M.NAME then
    return
  end
  local bufnr = args.buf
  if use_inline() then
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
  elseif vim.lsp.completion and vim.lsp.completion.enable then
    -- 0.11: the fill is the first item of the completion menu (asked for by the trigger key)
    vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = false })
  else
    vim.bo[bufnr].omnifunc = 'v:lua.vim.lsp.omnifunc'
  end
  map_keys(bufnr)
end

--- The vim.lsp client configuration for the resolved options.
---@param config diffusion_lsp.Config
---@return vim.lsp.ClientConfig
local function client_config(config)
  local settings = { diffusionLsp = config.settings }
  return {
    name = M.NAME,
    cmd = config.cmd,
    filetypes = config.filetypes,
    root_markers = config.root_markers,
    init_options = settings,
    settings = settings, -- answered to workspace/configuration (section diffusionLsp)
    handlers = { ['diffusion/draft'] = drafts.handler },
  }
end

--- Start (or reuse) the client for a buffer: the fallback where vim.lsp.enable is missing.
---@param bufnr integer
local function start(bufnr)
  if vim.bo[bufnr].buftype ~= '' then
    return
  end
  local config = client_config(assert(M.config))
  local fname = api.nvim_buf_get_name(bufnr)
  local root = vim.fs.root and vim.fs.root(fname, config.root_markers) or nil
  config.root_dir = root or vim.fs.dirname(fname)
  config.filetypes = nil
  config.root_markers = nil
  vim.lsp.start(config, { bufnr = bufnr })
end

--- Configure and start the plugin. Errors name an invalid option.
---@param opts? diffusion_lsp.Opts
function M.setup(opts)
  M.config = require('diffusion_lsp.config').resolve(opts)
  local group = api.nvim_create_augroup('diffusion_lsp', { clear = true })
  api.nvim_create_autocmd('LspAttach', { group = group, callback = on_attach })
  drafts.setup()
  actions.setup()
  if vim.lsp.config ~= nil and vim.lsp.enable ~= nil then
    vim.lsp.config(M.NAME, client_config(M.config))
    vim.lsp.enable(M.NAME)
  else
    api.nvim_create_autocmd('FileType', {
      group = group,
      pattern = M.config.filetypes,
      callback = function(args)
        start(args.buf)
      end,
    })
  end
end

return M
