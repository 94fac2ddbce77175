<#
.SYNOPSIS
    Helpers the kstack test-VM scripts share: finding the package, running
    sc.exe and kstack.exe, explaining their errors, the registry values
    kstack reads.

.DESCRIPTION
    Imported by the scripts beside it; not meant to be run on its own.
    Windows PowerShell 5.1 (what a fresh Windows 10/11 has) and PowerShell 7
    both load it. Nothing here was run on Windows by kstack's developers: the
    repository's checks only parse it (tests/tests/windows_deliverables.rs).
#>

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'

# kstack-abi's SERVICE_NAME, DRIVER_FILE_NAME, PARAMETERS_KEY and
# RING_CAPACITY_VALUE; kstack-driver-core's CAPACITY_RANGE_KIB (RingCapacity
# is in KiB since ABI 6: 16 KiB to 144 MiB).
$script:ServiceName = 'kstack'
$script:DriverFile = 'kstack.sys'
$script:ParametersKey = 'HKLM:\SYSTEM\CurrentControlSet\Services\kstack\Parameters'
$script:MemoryManagementKey = 'HKLM:\SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management'
$script:RingCapacityMin = 16
$script:RingCapacityMax = 147456

# Win32 errors sc.exe reports (its exit code is the error number), with what
# they mean for kstack and what to do.
$script:ScErrors = @{
    2    = 'ERROR_FILE_NOT_FOUND: the service''s binPath does not lead to kstack.sys. Run kstack-service.ps1 -Action delete, then -Action create from the package folder (on a local disk: the kernel does not load drivers from network shares).'
    3    = 'ERROR_PATH_NOT_FOUND: the folder in the service''s binPath does not exist. Recreate the service from where the package is now.'
    5    = 'ERROR_ACCESS_DENIED: run PowerShell as Administrator.'
    31   = 'ERROR_GEN_FAILURE: DriverEntry returned a failure status. Look in Event Viewer > Windows Logs > System for the service control manager entry, and run kstack-service.ps1 -Action status.'
    193  = 'ERROR_BAD_EXE_FORMAT: the file is not an x64 kernel image. Rebuild the package (cargo make, or cargo xtask build).'
    577  = 'ERROR_INVALID_IMAGE_HASH: Windows could not verify kstack.sys''s signature. Either test signing is off (enable-test-signing.ps1, then reboot: the desktop then says "Test Mode"), Secure Boot is on (it keeps test signing off), or kstack.sys is not signed (sign-driver.ps1; signing again after every rebuild).'
    1052 = 'ERROR_INVALID_SERVICE_CONTROL: the driver cannot be stopped (no DriverUnload). kstack always sets one: is the loaded kstack.sys a kstack build?'
    1056 = 'ERROR_SERVICE_ALREADY_RUNNING: kstack is already running.'
    1058 = 'ERROR_SERVICE_DISABLED: the service is disabled. Delete and create it again.'
    1060 = 'ERROR_SERVICE_DOES_NOT_EXIST: the kstack service is not installed (kstack-service.ps1 -Action create).'
    1061 = 'ERROR_SERVICE_CANNOT_ACCEPT_CTRL: the service is starting or stopping; wait a few seconds and try again.'
    1062 = 'ERROR_SERVICE_NOT_ACTIVE: kstack is not running.'
    1072 = 'ERROR_SERVICE_MARKED_FOR_DELETE: the service is marked for deletion and goes once every handle to it is closed: close Services, Event Viewer and any kstack.exe, or reboot.'
    1073 = 'ERROR_SERVICE_EXISTS: a kstack service exists already (kstack-service.ps1 -Action status shows it).'
    1275 = 'ERROR_DRIVER_BLOCKED: a policy blocked the driver: Memory integrity (HVCI), WDAC or the vulnerable driver blocklist (Smart App Control judges user-mode programs such as kstack.exe, not drivers). On a test VM, turn Memory integrity off (Windows Security > Device security > Core isolation) and reboot.'
    1450 = 'ERROR_NO_SYSTEM_RESOURCES: the ring could not be allocated. Lower Parameters\RingCapacity, in KiB (e.g. kstack-service.ps1 -Action create -RingCapacity 4096, a 4 MiB ring).'
}

function Get-ScErrorExplanation {
    <#
    .SYNOPSIS
        What a Win32 error from sc.exe means for kstack.
    #>
    [CmdletBinding()]
    param([Parameter(Mandatory = $true)] [int] $Code)
    if ($script:ScErrors.ContainsKey($Code)) {
        return $script:ScErrors[$Code]
    }
    return ('Win32 error {0}: {1}' -f $Code, (New-Object System.ComponentModel.Win32Exception $Code).Message)
}

function Invoke-Native {
    <#
    .SYNOPSIS
        Runs a program; returns its exit code, its standard output (Output)
        and its standard error (Errors) apart, and both (Text, for messages).
        Callers parse Output (JSON): a warning on stderr must not get in.
    #>
    [CmdletBinding()]
    param(
        [Parameter(Mandatory = $true)] [string] $FilePath,
        [string[]] $Arguments = @()
    )
    # A program that is not found does not run and sets no exit code:
    # $LASTEXITCODE would still be the last program's (0 after a success).
    $program = Get-Command -Name $FilePath -CommandType Application -ErrorAction SilentlyContinue | Select-Object -First 1
    if (-not $program) {
        throw ('{0} was not found (neither a file at that path nor a program on PATH).' -f $FilePath)
    }
    # Windows PowerShell 5.1 turns a program's stderr lines into error
    # records, which 'Stop' would make fatal; this scope only.
    $ErrorActionPreference = 'Continue'
    # Programs set the global $LASTEXITCODE (a local one would hide it).
    $global:LASTEXITCODE = $null
    $stdout = New-Object System.Collections.Generic.List[string]
    $stderr = New-Object System.Collections.Generic.List[string]
    & $program @Arguments 2>&1 | ForEach-Object {
        if ($_ -is [System.Management.Automation.ErrorRecord]) {
            $stderr.Add($_.ToString())
        } else {
            $stdout.Add("$_")
        }
    }
    $code = $global:LASTEXITCODE
    if ($null -eq $code) {
        throw ('{0} did not run: it set no exit code.' -f $program.Source)
    }
    return [pscustomobject]@{
        ExitCode = $code
        Output   = ($stdout -join "`n").TrimEnd()
        Errors   = ($stderr -join "`n").TrimEnd()
        Text     = ((@($stdout) + @($stderr)) -join "`n").TrimEnd()
    }
}

function Invoke-Sc {
    <#
    .SYNOPSIS
        Runs sc.exe; throws with an explanation unless it succeeded or failed
        with one of the -Allow codes. Returns the exit code.
    #>
    [CmdletBinding()]
    param(
        [Parameter(Mandatory = $true)] [string[]] $Arguments,
        [int[]] $Allow = @()
    )
    Write-Host ('> sc.exe {0}' -f ($Arguments -join ' '))
    $result = Invoke-Native -FilePath 'sc.exe' -Arguments $Arguments
    if ($result.ExitCode -eq 0) {
        return 0
    }
    if ($Allow -contains $result.ExitCode) {
        Write-Host ('  {0}' -f (Get-ScErrorExplanation -Code $result.ExitCode))
        return $result.ExitCode
    }
    throw ("sc.exe {0} failed with error {1}.`n{2}`n{3}" -f ($Arguments -join ' '), $result.ExitCode, (Get-ScErrorExplanation -Code $result.ExitCode), $result.Text)
}

function Resolve-KStackPackage {
    <#
    .SYNOPSIS
        The package folder: -PackageDir, else the folder above these scripts
        (the package's scripts folder), else target\kstack-package in the
        repository the scripts came from.
    #>
    [CmdletBinding()]
    param([string] $PackageDir, [Parameter(Mandatory = $true)] [string] $ScriptRoot)
    $candidates = @()
    if ($PackageDir) {
        $candidates += $PackageDir
    } else {
        $candidates += (Split-Path -Parent $ScriptRoot)
        $candidates += (Join-Path $ScriptRoot '..\..\target\kstack-package')
    }
    foreach ($candidate in $candidates) {
        if (Test-Path -LiteralPath (Join-Path $candidate $script:DriverFile)) {
            return (Resolve-Path -LiteralPath $candidate).ProviderPath
        }
    }
    throw ('No {0} in {1}. Pass -PackageDir with the folder that holds kstack.sys and kstack.exe (cargo make package-dir prints it on the build machine).' -f $script:DriverFile, ($candidates -join ' or '))
}

function Get-KStackDriver {
    <#
    .SYNOPSIS
        The kstack service as Win32_SystemDriver reports it (locale-independent),
        or $null when it is not installed.
    #>
    [CmdletBinding()]
    param()
    return Get-CimInstance -ClassName Win32_SystemDriver -Filter ("Name='{0}'" -f $script:ServiceName)
}

function Wait-KStackState {
    <#
    .SYNOPSIS
        Waits until the service reaches State ('Running' or 'Stopped').
    #>
    [CmdletBinding()]
    param(
        [Parameter(Mandatory = $true)] [ValidateSet('Running', 'Stopped')] [string] $State,
        [int] $TimeoutSeconds = 15
    )
    $deadline = (Get-Date).AddSeconds($TimeoutSeconds)
    while ((Get-Date) -lt $deadline) {
        $driver = Get-KStackDriver
        if ($driver -and $driver.State -eq $State) {
            return
        }
        Start-Sleep -Milliseconds 200
    }
    throw ('kstack did not reach state {0} within {1} s.' -f $State, $TimeoutSeconds)
}

function Close-KStackClients {
    <#
    .SYNOPSIS
        Ends every kstack.exe still running, so no handle to \\.\KStack stays
        open: Windows runs DriverUnload only after the last handle to the
        driver's device is closed, and until then sc.exe stop leaves the
        service STOP_PENDING.
    #>
    [CmdletBinding()]
    param()
    foreach ($client in @(Get-Process -Name 'kstack' -ErrorAction SilentlyContinue)) {
        Write-Host ('  closing kstack.exe (pid {0}) and its device handle before the stop' -f $client.Id)
        Stop-Process -Id $client.Id -Force
        $client.WaitForExit()
    }
}

function Stop-KStackDriver {
    <#
    .SYNOPSIS
        Stops the kstack service (DriverUnload runs) and waits until it is
        stopped; a stop that stays STOP_PENDING is an error that says why.
        Returns sc.exe's exit code (1062: it was not running).
    #>
    [CmdletBinding()]
    param([int] $TimeoutSeconds = 15)
    Close-KStackClients
    $code = Invoke-Sc -Arguments @('stop', 'kstack') -Allow @(1062)
    $deadline = (Get-Date).AddSeconds($TimeoutSeconds)
    while ((Get-Date) -lt $deadline) {
        $driver = Get-KStackDriver
        if ($driver -and $driver.State -eq 'Stopped') {
            return $code
        }
        Start-Sleep -Milliseconds 200
    }
    $state = (Get-KStackDriver).State
    if ($state -eq 'Stop Pending') {
        throw ('kstack stayed STOP_PENDING for {0} s: DriverUnload has not run. Some program still holds a handle to \\.\KStack (kstack.exe clients were closed first), or the unload is waiting for a callback that does not return.' -f $TimeoutSeconds)
    }
    throw ('kstack did not stop within {0} s (state {1}).' -f $TimeoutSeconds, $state)
}

function Get-RegistryDword {
    <#
    .SYNOPSIS
        A REG_DWORD value, or $null when the key or value is missing.
    #>
    [CmdletBinding()]
    param([Parameter(Mandatory = $true)] [string] $Key, [Parameter(Mandatory = $true)] [string] $Name)
    $item = Get-ItemProperty -LiteralPath $Key -Name $Name -ErrorAction SilentlyContinue
    if ($null -eq $item) {
        return $null
    }
    return [int64]$item.$Name
}

function Set-KStackRingCapacity {
    <#
    .SYNOPSIS
        Writes Parameters\RingCapacity (the ring's size in KiB, over all its
        shards), read at the next driver start.
    #>
    [CmdletBinding()]
    param([Parameter(Mandatory = $true)] [int] $KiB)
    if ($KiB -lt $script:RingCapacityMin -or $KiB -gt $script:RingCapacityMax) {
        throw ('RingCapacity must be {0} to {1} KiB (the driver would clamp {2}).' -f $script:RingCapacityMin, $script:RingCapacityMax, $KiB)
    }
    Set-KStackParameter -Name 'RingCapacity' -Value $KiB
    Write-Host ('Parameters\RingCapacity = {0} KiB (read when the driver starts).' -f $KiB)
}

function Get-PagingExecutive {
    <#
    .SYNOPSIS
        DisablePagingExecutive as the driver reads it at load ($null: not set).
    #>
    [CmdletBinding()]
    param()
    return Get-RegistryDword -Key $script:MemoryManagementKey -Name 'DisablePagingExecutive'
}

function Invoke-KStack {
    <#
    .SYNOPSIS
        Runs kstack.exe from the package; returns Invoke-Native's result
        (ExitCode, Output: stdout, Errors: stderr, Text: both). Its stderr
        is also shown. Throws unless its exit code is one of -Expect
        (default 0).
    #>
    [CmdletBinding()]
    param(
        [Parameter(Mandatory = $true)] [string] $PackageDir,
        [Parameter(Mandatory = $true)] [string[]] $Arguments,
        [int[]] $Expect = @(0)
    )
    Write-Host ('> kstack.exe {0}' -f ($Arguments -join ' '))
    $result = Invoke-Native -FilePath (Join-Path $PackageDir 'kstack.exe') -Arguments $Arguments
    if ($result.Errors) {
        Write-Host ('  stderr: {0}' -f $result.Errors)
    }
    if ($Expect -notcontains $result.ExitCode) {
        throw ("kstack.exe {0} exited with {1} (expected {2}):`n{3}" -f ($Arguments -join ' '), $result.ExitCode, ($Expect -join ' or '), $result.Text)
    }
    return $result
}

function Get-KStackStatus {
    <#
    .SYNOPSIS
        kstack.exe status --json as an object (README.md, "JSON output").
    #>
    [CmdletBinding()]
    param([Parameter(Mandatory = $true)] [string] $PackageDir)
    return (Invoke-KStack -PackageDir $PackageDir -Arguments @('status', '--json')).Output | ConvertFrom-Json
}

function Get-KStackParameter {
    <#
    .SYNOPSIS
        A REG_DWORD under the service's Parameters key ($null: not set).
    #>
    [CmdletBinding()]
    param([Parameter(Mandatory = $true)] [string] $Name)
    return Get-RegistryDword -Key $script:ParametersKey -Name $Name
}

function Set-KStackParameter {
    <#
    .SYNOPSIS
        Writes a REG_DWORD under the service's Parameters key (creating the
        key when it is absent); the driver reads it at its next start.
    #>
    [CmdletBinding()]
    param([Parameter(Mandatory = $true)] [string] $Name, [Parameter(Mandatory = $true)] [int64] $Value)
    if (-not (Test-Path -LiteralPath (Split-Path -Parent $script:ParametersKey))) {
        throw (Get-ScErrorExplanation -Code 1060)
    }
    # New-Item -Force on a key that exists deletes it and makes it anew,
    # empty: every value set before (RingCapacity, StackTableEntries, the
    # altitudes, the paging override) would go with it.
    if (-not (Test-Path -LiteralPath $script:ParametersKey)) {
        New-Item -Path $script:ParametersKey | Out-Null
    }
    New-ItemProperty -LiteralPath $script:ParametersKey -Name $Name -PropertyType DWord -Value $Value -Force | Out-Null
}

function Remove-KStackParameter {
    <#
    .SYNOPSIS
        Removes a value under the service's Parameters key, if it is there.
    #>
    [CmdletBinding()]
    param([Parameter(Mandatory = $true)] [string] $Name)
    Remove-ItemProperty -LiteralPath $script:ParametersKey -Name $Name -ErrorAction SilentlyContinue
}

Export-ModuleMember -Function Get-ScErrorExplanation, Invoke-Native, Invoke-Sc, Resolve-KStackPackage, Get-KStackDriver, Wait-KStackState, Close-KStackClients, Stop-KStackDriver, Get-RegistryDword, Set-KStackRingCapacity, Get-PagingExecutive, Invoke-KStack, Get-KStackStatus, Get-KStackParameter, Set-KStackParameter, Remove-KStackParameter
