--- Drafts: the fill as it forms. The server sends `diffusion/draft` notifications (one per
--- denoising step) while an inline completion request runs; each one replaces the last in
--- place, as an extmark at the insertion point, and the response to the request clears it.

local M = {}

local api = vim.api
local util = require('diffusion_lsp.util')

M.namespace = api.nvim_create_namespace('diffusion_lsp.drafts')

---@class diffusion_lsp.DraftParams
---@field requestId integer|string The inlineCompletion request the draft belongs to
---@field textDocument { uri: string, version?: integer }
---@field position { line: integer, character: integer }
---@field text string The fill as it stands at this step
---@field step integer
---@field done boolean

---@class (private) diffusion_lsp.Shown
---@field client_id integer
---@field request_id integer|string
---@field mark integer Extmark id

--- One shown draft per buffer.
---@type table<integer, diffusion_lsp.Shown>
local shown = {}

--- Per client, the newest inlineCompletion request answered: a draft for it or an older
--- request arrived late and is ignored (request ids increase).
---@type table<integer, integer>
local answered = {}

api.nvim_set_hl(0, 'DiffusionDraft', { link = 'Comment', default = true })

---@param bufnr integer
function M.clear(bufnr)
  shown[bufnr] = nil
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  end
end

--- Render a draft (replacing the buffer's previous one) at its position.
---@param bufnr integer
---@param client_id integer
---@param params diffusion_lsp.DraftParams
function M.show(bufnr, client_id, params)
  local client = vim.lsp.get_client_by_id(client_id)
  if not client or params.done then
    return
  end
  if type(params.requestId) == 'number' and params.requestId <= (answered[client_id] or -1) then
    return
  end
  local version = params.textDocument.version
  if version ~= nil and version ~= util.version(bufnr) then
    return -- a draft for text the user has changed since
  end
  local row, col = util.byte_position(bufnr, params.position, client.offset_encoding or 'utf-16')
  if row >= api.nvim_buf_line_count(bufnr) then
    return
  end
  local lines = vim.split(params.text, '\n', { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], 'DiffusionDraft' } }
  end
  local previous = shown[bufnr]
  local mark = api.nvim_buf_set_extmark(bufnr, M.namespace, row, col, {
    id = previous and previous.mark or nil, -- replaced in place
    virt_text = { { lines[1], 'DiffusionDraft' } },
    virt_text_pos = 'inline',
    virt_lines = virt_lines,
    hl_mode = 'combine',
  })
  shown[bufnr] = { client_id = client_id, request_id = params.requestId, mark = mark }
end

--- `lsp.Handler` for the `diffusion/draft` notification.
---@param _ lsp.ResponseError?
---@param params diffusion_lsp.DraftParams
---@param ctx lsp.HandlerContext
function M.handler(_, params, ctx)
  if type(params) ~= 'table' or type(params.text) ~= 'string' or type(params.textDocument) ~= 'table' then
    return
  end
  local bufnr = vim.uri_to_bufnr(params.textDocument.uri)
  if not api.nvim_buf_is_loaded(bufnr) then
    return
  end
  M.show(bufnr, ctx.client_id, params)
end

--- Clear a draft when the response to its request arrives (or the request is cancelled).
---@param args { buf: integer, data: { client_id: integer, request_id: integer, request: { type: string, method: string } } }
local function on_request(args)
  local data = args.data
  if not data or not data.request or data.request.method ~= 'textDocument/inlineCompletion' then
    return
  end
  if data.request.type == 'pending' then
    return
  end
  answered[data.client_id] = math.max(answered[data.client_id] or -1, data.request_id)
  for bufnr, draft in pairs(shown) do
    if draft.client_id == data.client_id and draft.request_id == data.request_id then
      M.clear(bufnr)
    end
  end
end

--- Clear drafts on leaving insert mode, on text changes and on detach.
function M.setup()
  local group = api.nvim_create_augroup('diffusion_lsp.drafts', { clear = true })
  api.nvim_create_autocmd('LspRequest', { group = group, callback = on_request })
  api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
    group = group,
    callback = function(args)
      M.clear(args.buf)
    end,
  })
  api.nvim_create_autocmd('LspDetach', {
    group = group,
    callback = function(args)
      M.clear(args.buf)
      answered[args.data.client_id] = nil
    end,
  })
end

return M
