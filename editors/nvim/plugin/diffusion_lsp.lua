-- diffusion-lsp's user commands, defined when Neovim loads the plugin (before and without
-- setup(), so `:Diffusion<Tab>` completes from the start); each loads the plugin's code
-- only when it runs. setup() starts the server: `:help diffusion-lsp`.
if vim.g.loaded_diffusion_lsp then
  return
end
vim.g.loaded_diffusion_lsp = true

local api = vim.api
local cmd = api.nvim_create_user_command

local function actions()
  return require('diffusion_lsp.actions')
end

cmd('DiffusionFillHoles', function()
  actions().fill_holes()
end, { desc = 'diffusion-lsp: fill every hole in the buffer' })
cmd('DiffusionFillHole', function()
  actions().fill_hole()
end, { desc = 'diffusion-lsp: fill the hole at the cursor' })
cmd('DiffusionRegenerate', function(o)
  local bufnr = api.nvim_get_current_buf()
  actions().rewrite(bufnr, actions().selection(bufnr, o.line1, o.line2), false)
end, { range = true, desc = 'diffusion-lsp: regenerate the selection' })
cmd('DiffusionRefine', function(o)
  local bufnr = api.nvim_get_current_buf()
  actions().rewrite(bufnr, actions().selection(bufnr, o.line1, o.line2), true)
end, { range = true, desc = 'diffusion-lsp: refine the selection (re-fill its unlikely tokens)' })
cmd('DiffusionNextEdit', function(o)
  actions().next_edit(nil, o.bang)
end, { bang = true, desc = 'diffusion-lsp: suggest the next edit (again, or with !, to apply it)' })
