--- The server's commands (fill holes, regenerate, refine) and next-edit suggestions
--- (`diffusion/inlineEdit`), behind the plugin's user commands.
---
--- The commands edit the buffer through the server: it answers
--- `workspace/executeCommand` after sending a versioned `workspace/applyEdit`, which
--- Neovim applies (and skips when the buffer changed meanwhile).

local M = {}

local api = vim.api
local util = require('diffusion_lsp.util')

M.NAME = 'diffusion_lsp'
M.namespace = api.nvim_create_namespace('diffusion_lsp.next_edit')

api.nvim_set_hl(0, 'DiffusionEditOld', { link = 'DiffDelete', default = true })
api.nvim_set_hl(0, 'DiffusionEditNew', { link = 'DiffAdd', default = true })

---@param msg string
---@param level? integer
local function notify(msg, level)
  vim.notify('diffusion-lsp: ' .. msg, level or vim.log.levels.INFO)
end

--- The diffusion-lsp client attached to `bufnr`, or nil (with a message).
---@param bufnr integer
---@return vim.lsp.Client?
function M.client(bufnr)
  local clients = vim.lsp.get_clients({ bufnr = bufnr, name = M.NAME })
  if #clients == 0 then
    notify('no diffusion-lsp client in this buffer', vim.log.levels.WARN)
    return nil
  end
  return clients[1]
end

--- Send a request through the client (method call syntax on 0.11+, field call on 0.10).
---@param client vim.lsp.Client
---@param method string
---@param params table
---@param handler fun(err: lsp.ResponseError?, result: any, ctx: lsp.HandlerContext)
---@param bufnr integer
local function request(client, method, params, handler, bufnr)
  if vim.fn.has('nvim-0.11') == 1 then
    client:request(method, params, handler, bufnr)
  else
    ---@diagnostic disable-next-line: param-type-mismatch
    client.request(method, params, handler, bufnr)
  end
end

--- Tell the server something about the buffer (a command whose one argument is its
--- URI), quietly; `on_done` runs once the server has it. False when no client is attached.
---@param bufnr integer
---@param command string
---@param on_done? fun()
---@return boolean
function M.tell(bufnr, command, on_done)
  local clients = vim.lsp.get_clients({ bufnr = bufnr, name = M.NAME })
  if #clients == 0 then
    return false
  end
  local params = { command = command, arguments = { vim.uri_from_bufnr(bufnr) } }
  request(clients[1], 'workspace/executeCommand', params, function()
    if on_done then
      on_done()
    end
  end, bufnr)
  return true
end

--- Run one of the server's commands and report what it did.
---@param client vim.lsp.Client
---@param bufnr integer
---@param command string
---@param arguments any[]
---@param label string
---@param on_done? fun(edit: lsp.WorkspaceEdit?)
local function run(client, bufnr, command, arguments, label, on_done)
  request(client, 'workspace/executeCommand', { command = command, arguments = arguments }, function(err, result)
    if err then
      notify(('%s failed: %s'):format(label, err.message), vim.log.levels.ERROR)
    elseif result == nil or result == vim.NIL then
      notify(label .. ': nothing to do (no hole here, or the buffer changed meanwhile)')
    end
    if on_done then
      on_done(result ~= vim.NIL and result or nil)
    end
  end, bufnr)
end

--- Fill every hole (`pass`, `...`, TODO markers, empty bodies) in the buffer.
---@param bufnr? integer
---@param on_done? fun(edit: lsp.WorkspaceEdit?)
function M.fill_holes(bufnr, on_done)
  bufnr = bufnr or api.nvim_get_current_buf()
  local client = M.client(bufnr)
  if client then
    run(client, bufnr, 'diffusion.fillAllHoles', { vim.uri_from_bufnr(bufnr) }, 'fill holes', on_done)
  end
end

--- Fill the hole at the cursor.
---@param bufnr? integer
---@param on_done? fun(edit: lsp.WorkspaceEdit?)
function M.fill_hole(bufnr, on_done)
  bufnr = bufnr or api.nvim_get_current_buf()
  local client = M.client(bufnr)
  if client then
    local cursor = api.nvim_win_get_cursor(0)
    local pos = util.position(bufnr, cursor[1] - 1, cursor[2], client.offset_encoding)
    run(client, bufnr, 'diffusion.fillHole', { vim.uri_from_bufnr(bufnr), pos.line, pos.character }, 'fill hole', on_done)
  end
end

---@class diffusion_lsp.Selection
---@field start [integer, integer] 0-based row, byte column
---@field end_ [integer, integer] 0-based row, byte column (exclusive)

--- The selection a ranged user command was given: the last visual selection when the
--- range is its lines (characterwise if it was), else the whole lines of the range.
---@param bufnr integer
---@param line1 integer 1-based
---@param line2 integer 1-based
---@return diffusion_lsp.Selection
function M.selection(bufnr, line1, line2)
  local s, e = api.nvim_buf_get_mark(bufnr, '<'), api.nvim_buf_get_mark(bufnr, '>')
  if s[1] == line1 and e[1] == line2 and vim.fn.visualmode() == 'v' then
    local last = api.nvim_buf_get_lines(bufnr, e[1] - 1, e[1], false)[1] or ''
    -- the end mark is on the last selected character: include all its bytes
    local char_end = e[2] < #last and (e[2] + #vim.fn.strcharpart(last:sub(e[2] + 1), 0, 1)) or #last
    return { start = { s[1] - 1, s[2] }, end_ = { e[1] - 1, char_end } }
  end
  local last = api.nvim_buf_get_lines(bufnr, line2 - 1, line2, false)[1] or ''
  return { start = { line1 - 1, 0 }, end_ = { line2 - 1, #last } }
end

--- Regenerate (refine = false: everything re-filled) or refine (the few fixes the model
--- finds it needs) a selection; the server grows it to whole syntax nodes.
---@param bufnr integer
---@param sel diffusion_lsp.Selection
---@param refine boolean
---@param on_done? fun(edit: lsp.WorkspaceEdit?)
function M.rewrite(bufnr, sel, refine, on_done)
  local client = M.client(bufnr)
  if not client then
    return
  end
  local enc = client.offset_encoding
  local a = util.position(bufnr, sel.start[1], sel.start[2], enc)
  local b = util.position(bufnr, sel.end_[1], sel.end_[2], enc)
  local command = refine and 'diffusion.refineSelection' or 'diffusion.regenerateSelection'
  local args = { vim.uri_from_bufnr(bufnr), a.line, a.character, b.line, b.character }
  run(client, bufnr, command, args, refine and 'refine' or 'regenerate', on_done)
end

-- Next edit suggestions ------------------------------------------------------------------

---@class (private) diffusion_lsp.NextEdit
---@field edit { range: lsp.Range, text: string, textDocument: { uri: string, version?: integer } }
---@field version integer Buffer version the suggestion was made for
---@field encoding string

---@type table<integer, diffusion_lsp.NextEdit>
local pending = {}

---@param bufnr integer
function M.clear_next_edit(bufnr)
  pending[bufnr] = nil
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  end
end

--- Show a suggestion: the old text marked, the new text beside it (one line: inline,
--- after the old text; several: as virtual lines below it).
---@param bufnr integer
---@param next_edit diffusion_lsp.NextEdit
local function show(bufnr, next_edit)
  api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  local rng = next_edit.edit.range
  local srow, scol = util.byte_position(bufnr, rng.start, next_edit.encoding)
  local erow, ecol = util.byte_position(bufnr, rng['end'], next_edit.encoding)
  local lines = vim.split(next_edit.edit.text, '\n', { plain = true })
  local mark = { end_row = erow, end_col = ecol, hl_group = 'DiffusionEditOld' }
  if #lines == 1 then
    api.nvim_buf_set_extmark(bufnr, M.namespace, srow, scol, mark)
    api.nvim_buf_set_extmark(bufnr, M.namespace, erow, ecol, {
      virt_text = { { lines[1], 'DiffusionEditNew' } },
      virt_text_pos = 'inline',
    })
    return
  end
  mark.virt_lines = {}
  for _, l in ipairs(lines) do
    mark.virt_lines[#mark.virt_lines + 1] = { { l, 'DiffusionEditNew' } }
  end
  api.nvim_buf_set_extmark(bufnr, M.namespace, srow, scol, mark)
end

--- Apply a pending suggestion if the buffer is still at its version.
---@param bufnr integer
---@return boolean applied
function M.apply_next_edit(bufnr)
  local next_edit = pending[bufnr]
  M.clear_next_edit(bufnr)
  if not next_edit or next_edit.version ~= util.version(bufnr) then
    return false
  end
  local e = next_edit.edit
  vim.lsp.util.apply_text_edits({ { range = e.range, newText = e.text } }, bufnr, next_edit.encoding)
  return true
end

--- Ask for a next edit suggestion at the cursor. `apply`: take it at once; otherwise
--- show it, and a second call (with the buffer unchanged) takes it.
---@param bufnr? integer
---@param apply? boolean
---@param on_done? fun(edit: table?)
function M.next_edit(bufnr, apply, on_done)
  bufnr = bufnr or api.nvim_get_current_buf()
  local shown = pending[bufnr]
  if shown and shown.version == util.version(bufnr) then
    local applied = M.apply_next_edit(bufnr)
    if on_done then
      on_done(applied and shown.edit or nil)
    end
    return
  end
  local client = M.client(bufnr)
  if not client then
    return
  end
  local cursor = api.nvim_win_get_cursor(0)
  local version = util.version(bufnr)
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr), version = version },
    position = util.position(bufnr, cursor[1] - 1, cursor[2], client.offset_encoding),
  }
  request(client, 'diffusion/inlineEdit', params, function(err, result)
    local edit = not err and type(result) == 'table' and (result.edits or {})[1] or nil
    if err then
      notify('next edit failed: ' .. err.message, vim.log.levels.ERROR)
    elseif not edit then
      notify('no edit to suggest here')
    elseif util.version(bufnr) ~= version or (edit.textDocument.version or version) ~= version then
      edit = nil -- the buffer moved on while the server worked
    else
      pending[bufnr] = { edit = edit, version = version, encoding = client.offset_encoding }
      if apply then
        M.apply_next_edit(bufnr)
      else
        show(bufnr, pending[bufnr])
      end
    end
    if on_done then
      on_done(edit)
    end
  end, bufnr)
end

--- Drop a shown suggestion when the buffer changes.
function M.setup()
  local group = api.nvim_create_augroup('diffusion_lsp.next_edit', { clear = true })
  api.nvim_create_autocmd({ 'TextChanged', 'TextChangedI', 'BufLeave' }, {
    group = group,
    callback = function(args)
      if pending[args.buf] then
        M.clear_next_edit(args.buf)
      end
    end,
  })
end

return M
